"""A local SparkSession with the gated source registered."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from sdk.spark._settings import NAME
from sdk.spark._source import GatedKafkaSource

# local, local[4], local[*], local[4,2] (cores, task attempts); local-cluster[2,1,1024]
# (workers, cores per worker, MiB per worker)
LOCAL_MASTER = re.compile(r"local(\[(\d+|\*)(,\d+)?\])?|local-cluster\[\d+,\d+,\d+\]")

# The folder that holds the ``sdk`` package: executors of a local cluster import it from here.
PROJECT_ROOT = Path(__file__).resolve().parents[2]


def local_session(app_name: str = NAME, cores: int = 2, master: str | None = None) -> Any:
    """A SparkSession on this machine with the gated source registered, for examples, tests and
    trying things out: ``local[cores]`` by default, or the local ``master`` given, such as
    ``local-cluster[2,1,1024]`` (two executor JVMs of one core and 1 GiB each, with Python
    workers of their own, as on a cluster). Executors run this Python interpreter and import
    this checkout's ``sdk``, and the driver's JVM gets the stack Spark's stop handling needs
    (a query stopped mid-batch otherwise prints a ``StackOverflowError``). Set these options
    yourself for a real cluster."""
    import os
    import sys

    from pyspark import SparkConf, SparkContext
    from pyspark.find_spark_home import _find_spark_home
    from pyspark.java_gateway import launch_gateway
    from pyspark.sql import SparkSession

    master = master or f"local[{cores}]"
    if not LOCAL_MASTER.fullmatch(master):
        raise ValueError(
            f"master {master!r} is not a local one: use local[N], local[*] or "
            "local-cluster[workers,cores,MiB] (for a real cluster, build the session yourself)"
        )
    running = SparkContext._active_spark_context
    if running is not None and running.master != master:
        raise ValueError(
            f"a SparkSession with master {running.master!r} is running in this process: "
            f"stop it before starting one with {master!r} (one SparkContext per process)"
        )
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    # A local cluster's workers start executor JVMs with Spark's scripts: the pip package is
    # the Spark installation.
    os.environ.setdefault("SPARK_HOME", _find_spark_home())
    python_path = os.pathsep.join(
        part for part in (str(PROJECT_ROOT), os.environ.get("PYTHONPATH", "")) if part
    )
    conf = (
        SparkConf()
        .setMaster(master)
        .setAppName(app_name)
        .set("spark.ui.enabled", "false")
        .set("spark.ui.showConsoleProgress", "false")
        .set("spark.sql.shuffle.partitions", str(cores))
        .set("spark.driver.extraJavaOptions", "-Xss32m")
        .set("spark.pyspark.python", os.environ["PYSPARK_PYTHON"])
        .set("spark.executorEnv.PYTHONPATH", python_path)
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
