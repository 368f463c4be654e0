"""call_service over amqps:// with a private CA and a client certificate (SASL EXTERNAL):
real PySpark against a real server."""

from __future__ import annotations

import os

import pytest
from pyspark.sql import SparkSession

from pairlink.spark import serve_in_thread
from tests.spark.recorder import Recorder, expected
from tests.spark.test_call_service import score
from tests.tls import CLIENT_IDENTITY, TlsFiles

pytestmark = [pytest.mark.spark, pytest.mark.timeout(180)]


def test_a_job_calls_over_tls_with_a_private_ca_and_a_client_certificate(
    spark: SparkSession, tls_files: TlsFiles
) -> None:
    # the test CA comes from the option alone: the process's default trust store lacks it
    assert os.environ.get("SSL_CERT_FILE") != str(tls_files.ca_cert)
    with serve_in_thread(
        Recorder(),
        listen="amqps://127.0.0.1:0",
        ssl_context=tls_files.server_context(require_client_cert=True),
        certificate_users={CLIENT_IDENTITY},  # and no users: ANONYMOUS is refused
    ) as server:
        assert server.url.startswith("amqps://")
        df = spark.range(300, numPartitions=2).selectExpr("id", "concat('row ', id) as text")
        got = score(
            df,
            server.url,
            ca=tls_files.ca_cert,
            client_cert=tls_files.client_cert,
            client_key=tls_files.client_key,
            sasl="EXTERNAL",
        ).collect()
    assert sorted((r.id, r.score, r.label) for r in got) == [(i, *expected(i)) for i in range(300)]
