"""PySpark fan-out: call a pairlink service from every row of a DataFrame or RDD.

```python
from pairlink.spark import call_service, local_session

spark = local_session()
out = call_service(
    df, url="amqp://127.0.0.1:5672", address="enrich", operation="score",
    args=["id", "text"], result_schema="score double, label string", key="id",
)
```

Importing this module imports neither pyspark nor pyarrow (the functions do, when called),
so ``pairlink`` stays usable where Spark is not installed; ``import pairlink`` never
imports this module.
"""

from pairlink._spark.api import ERROR_COLUMN, call_partitions, call_service, local_session
from pairlink._spark.background import serve_in_thread
from pairlink._spark.progress import Progress
from pairlink._spark.sql import register_function

__all__ = [
    "ERROR_COLUMN",
    "Progress",
    "call_partitions",
    "call_service",
    "local_session",
    "register_function",
    "serve_in_thread",
]
