"""The compare's warm broker: the JVM options reach the bench broker, and the JIT's CPU is read
from a live JVM's compiler threads (bench.broker_profile.jit_cpu_s)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from bench.broker_profile import jit_cpu_s
from duetime.infra.local_kafka import JVM_OPTS
from duetime.infra.stack import LocalStack, StackSettings
from tests.helpers import wait_for

SPIN = """
public class Spin {
    public static void main(String[] args) throws Exception {
        long x = 0;
        for (long i = 0; i < 400_000_000L; i++) { x += i % 7; }
        System.out.println(x);
        Thread.sleep(60_000);
    }
}
"""


def test_the_stack_gives_its_broker_the_jvm_options_it_names(tmp_path: Path) -> None:
    assert LocalStack(StackSettings(home=tmp_path)).kafka.jvm_opts == JVM_OPTS
    assert LocalStack(StackSettings(home=tmp_path, kafka_jvm_opts=())).kafka.jvm_opts == ()


@pytest.mark.skipif(shutil.which("java") is None, reason="needs a JDK")
def test_the_jit_threads_cpu_of_a_running_jvm(tmp_path: Path) -> None:
    source = tmp_path / "Spin.java"
    source.write_text(SPIN)
    jvm = subprocess.Popen(["java", "-Xmx64m", str(source)], stdout=subprocess.DEVNULL)
    try:
        # the source launcher compiles Spin in the JVM, then the loop gets hot: both are JIT work
        wait_for(lambda: jit_cpu_s(jvm.pid) > 0.05, timeout_s=60, what="the JVM's JIT CPU")
        first = jit_cpu_s(jvm.pid)
        assert jit_cpu_s(jvm.pid) >= first  # cumulative
    finally:
        jvm.kill()
        jvm.wait()
    assert jit_cpu_s(os.getpid()) == 0.0  # a Python process has no compiler threads
