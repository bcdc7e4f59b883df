"""A local SparkSession with the gated source registered."""

from __future__ import annotations

from typing import Any

from sdk.spark._settings import NAME
from sdk.spark._stream import GatedKafkaSource


def local_session(app_name: str = NAME, cores: int = 2) -> Any:
    """A SparkSession in local mode with the gated source registered, for examples, tests and
    trying things out. Executors run this Python interpreter, and the driver's JVM gets the
    stack Spark's stop handling needs (a query stopped mid-batch otherwise prints a
    ``StackOverflowError``). Set these options yourself for a cluster."""
    import os
    import sys

    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    conf = (
        SparkConf()
        .setMaster(f"local[{cores}]")
        .setAppName(app_name)
        .set("spark.ui.enabled", "false")
        .set("spark.ui.showConsoleProgress", "false")
        .set("spark.sql.shuffle.partitions", str(cores))
        .set("spark.driver.extraJavaOptions", "-Xss32m")
    )
    if SparkContext._gateway is None:
        # The JVM (and the Python workers it starts) in a session of its own: Ctrl-C in a
        # terminal, or SIGTERM to the process group, reaches this Python process only, which
        # stops the queries and the session itself; the JVM ends when this process does.
        gateway = launch_gateway(conf, popen_kwargs={"start_new_session": True})
        SparkContext(conf=conf, gateway=gateway)
    session = SparkSession.builder.config(conf=conf).getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    session.dataSource.register(GatedKafkaSource)
    return session
