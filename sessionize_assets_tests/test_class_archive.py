"""The JVM class archive: valid for one JVM build and one Spark jars folder, added to the driver's
options when set-up built it, never over options that already say how to share classes."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from sessionize_assets import class_archive
from sessionize_assets.resources.spark_conf import JVM_OPTION_VARIABLES, spark_conf

OPTIONS = "spark.driver.extraJavaOptions"


@pytest.fixture
def fake_jvm_and_spark(tmp_path: Path, monkeypatch) -> tuple[Path, Path]:
    """A JVM home and a Spark jars folder of this test's own, and the jars folder (where archives
    are kept) in tmp_path."""
    java_home = tmp_path / "jdk"
    (java_home / "bin").mkdir(parents=True)
    (java_home / "bin" / "java").write_text("")
    (java_home / "release").write_text('JAVA_VERSION="17.0.99"\n')
    spark_jars = tmp_path / "spark" / "jars"
    spark_jars.mkdir(parents=True)
    monkeypatch.setenv("JAVA_HOME", str(java_home))
    monkeypatch.setattr(class_archive, "_spark_jars", lambda: spark_jars)
    monkeypatch.setattr(class_archive, "jars_dir", lambda: tmp_path / "jars")
    for name in (class_archive.SWITCH_ENV, class_archive.BUILD_ENV, *JVM_OPTION_VARIABLES):
        monkeypatch.delenv(name, raising=False)
    return java_home, spark_jars


def test_an_archive_belongs_to_one_jvm_and_one_spark_jars_folder(fake_jvm_and_spark, tmp_path):
    java_home, spark_jars = fake_jvm_and_spark
    first = class_archive.archive_path()
    assert first is not None and first.parent == tmp_path / "jars" / "class-archives"
    assert class_archive.archive_path() == first  # stable
    (java_home / "release").write_text('JAVA_VERSION="17.0.100"\n')  # the JVM was upgraded
    second = class_archive.archive_path()
    assert second != first
    (spark_jars / "another.jar").write_text("")  # a jar added: the folder changed
    os.utime(spark_jars, ns=(1, 1))
    assert class_archive.archive_path() not in (first, second)


def test_the_driver_maps_the_archive_only_when_set_up_built_it(fake_jvm_and_spark, monkeypatch):
    assert spark_conf()[OPTIONS] == "-XX:+UseParallelGC"  # none built: nothing added
    archive = class_archive.archive_path()
    archive.parent.mkdir(parents=True)
    archive.write_bytes(b"archive")
    assert spark_conf()[OPTIONS] == (
        f"-XX:+UseParallelGC -XX:SharedArchiveFile={archive} -Xlog:cds=off -Xlog:cds+dynamic=off"
    )
    # A user's options get it too (it only saves start time), unless they say how to share.
    assert spark_conf({OPTIONS: "-Xss8m"})[OPTIONS].startswith(
        f"-Xss8m -XX:SharedArchiveFile={archive}"
    )
    assert spark_conf({OPTIONS: "-Xshare:off"})[OPTIONS] == "-Xshare:off"
    monkeypatch.setenv("JDK_JAVA_OPTIONS", "-XX:SharedArchiveFile=/elsewhere.jsa")
    assert spark_conf()[OPTIONS] == "-XX:+UseParallelGC"
    monkeypatch.delenv("JDK_JAVA_OPTIONS")
    monkeypatch.setenv(class_archive.SWITCH_ENV, "off")
    assert spark_conf()[OPTIONS] == "-XX:+UseParallelGC"
    monkeypatch.delenv(class_archive.SWITCH_ENV)
    monkeypatch.setenv(class_archive.BUILD_ENV, "/tmp/building.jsa")  # the archiving run
    assert "-XX:ArchiveClassesAtExit=/tmp/building.jsa" in spark_conf()[OPTIONS]
    assert "SharedArchiveFile" not in spark_conf()[OPTIONS]


def test_build_keeps_an_archive_it_has_and_makes_none_when_the_workload_fails(
    fake_jvm_and_spark, monkeypatch, capsys
):
    archive = class_archive.archive_path()
    monkeypatch.setattr(sys, "executable", "/bin/false")  # the archiving run fails at once
    assert class_archive.build(announce=True) is None
    assert "building the JVM class archive" in capsys.readouterr().err  # set-up says why it waits
    assert not archive.exists() and not list(archive.parent.glob("*.part"))
    archive.write_bytes(b"archive")
    assert class_archive.build(announce=True) == archive  # present: no run (false would fail it)
    assert capsys.readouterr().err == ""  # and nothing said
    monkeypatch.setenv(class_archive.SWITCH_ENV, "off")
    assert class_archive.build() is None


def test_the_tests_jvm_maps_the_archive_set_up_built(spark):
    """On a machine set up by `scripts/dev.sh` (CI's included) the archive exists and this
    process's Spark started with it, and the JVM kept class sharing on."""
    archive = class_archive.archive_path()
    if os.environ.get(class_archive.SWITCH_ENV, "").lower() == "off" or archive is None:
        pytest.skip("class archive turned off here")
    if not archive.is_file():
        pytest.skip(f"set-up built no class archive here ({archive})")
    jvm = spark.sparkContext._jvm
    arguments = list(
        jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments()
    )
    assert f"-XX:SharedArchiveFile={archive}" in arguments
    diagnostics = jvm.java.lang.management.ManagementFactory.getPlatformMXBean(
        jvm.java.lang.Class.forName("com.sun.management.HotSpotDiagnosticMXBean")
    )
    assert diagnostics.getVMOption("UseSharedSpaces").getValue() == "true"


def test_archives_of_a_spark_jars_folder_that_is_gone_are_deleted(tmp_path):
    """A removed clone's `.venv` leaves its archive behind; the next build deletes it."""
    folder = tmp_path / "class-archives"
    folder.mkdir()
    live_jars = tmp_path / "venv" / "jars"
    live_jars.mkdir(parents=True)
    for name, jars in (("live", live_jars), ("gone", tmp_path / "removed" / "jars")):
        (folder / f"spark-{name}.jsa").write_bytes(b"archive")
        (folder / f"spark-{name}.source").write_text(f"{jars}\n")
    (folder / "spark-unknown.jsa").write_bytes(b"archive")  # no .source: kept
    assert class_archive.prune(folder) == [folder / "spark-gone.jsa"]
    assert sorted(p.name for p in folder.iterdir()) == [
        "spark-live.jsa",
        "spark-live.source",
        "spark-unknown.jsa",
    ]
