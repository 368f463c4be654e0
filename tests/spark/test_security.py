"""call_service over amqps:// with a private CA and a client certificate (SASL EXTERNAL), and
no credential in what a failing job shows: real PySpark against real servers."""

from __future__ import annotations

import os
import traceback

import pytest
from pyspark.sql import SparkSession
from structlog.testing import capture_logs

from pairlink import blocking
from pairlink.errors import PairlinkError
from pairlink.spark import serve_in_thread
from tests.spark.recorder import Recorder, expected
from tests.spark.test_call_service import score
from tests.tls import CLIENT_IDENTITY, TlsFiles

pytestmark = [pytest.mark.spark, pytest.mark.timeout(180)]

SECRET = "s3cret-pw-7"


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


def test_no_password_in_a_failed_job_or_a_failed_call_or_any_log(spark: SparkSession) -> None:
    """A wrong password, a right one to a wrong address: the password is in no exception
    text (Spark's included), traceback or log event of the driver, client and server."""
    with (
        capture_logs() as logs,
        serve_in_thread(Recorder(), users={"alice": SECRET}) as server,
    ):
        wrong = server.url.replace("amqp://", "amqp://alice:wrong-pw-9@")
        right = server.url.replace("amqp://", "amqp://alice:" + SECRET + "@")
        df = spark.range(20, numPartitions=1).selectExpr("id", "concat('row ', id) as text")
        texts = []
        for url, address in ((wrong, "recorder"), (right, "scorre")):
            with pytest.raises(Exception) as failed:
                score(df, url, address, connect_timeout=5.0).collect()
            texts.append("".join(traceback.format_exception(failed.value)))
            with (
                pytest.raises(PairlinkError) as failed_here,
                blocking.connect(url, timeout=5) as client,
            ):
                client.call(address, "score", 1, "x")
            texts.append("".join(traceback.format_exception(failed_here.value)))
    assert "cannot reach the service 'recorder'" in texts[0]
    assert "no service at the address 'scorre'" in texts[2]
    shown = texts + [repr(event) for event in logs]
    assert [text for text in shown if SECRET in text or "wrong-pw-9" in text] == []
