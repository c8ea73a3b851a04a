"""The machine's pressure counters read from a /proc-like directory, and what the isolation
report makes of them."""

from __future__ import annotations

import os
from pathlib import Path

from notiflow.bench import calibrate, host
from notiflow.bench.report import isolation_markdown, isolation_plot

PSI = ("some avg10=0.00 avg60=0.00 avg300=0.00 total={some}\n"
       "full avg10=0.00 avg60=0.00 avg300=0.00 total={full}\n")


def _proc(root: Path, *, io: tuple[int, int], cpu: int, dirty: int, sectors: int,
          write_ms: int) -> Path:
    (root / "pressure").mkdir(parents=True, exist_ok=True)
    (root / "pressure" / "io").write_text(PSI.format(some=io[0], full=io[1]))
    (root / "pressure" / "cpu").write_text(PSI.format(some=cpu, full=0))
    (root / "pressure" / "memory").write_text(PSI.format(some=0, full=0))
    (root / "vmstat").write_text(f"nr_free_pages 100\nnr_dirty {dirty}\nnr_writeback 256\n"
                                 "nr_dirtied 9\n")
    (root / "diskstats").write_text(
        f" 254 0 vda 1 0 {sectors // 2} {write_ms // 3} 5 0 {sectors} {write_ms} 0 9 9 0 0 0 0 0"
        "\n"
        f" 254 1 vda1 1 0 8 1 5 0 {sectors} {write_ms} 0 9 9 0 0 0 0 0 0\n"
        "   7 0 loop0 1 0 8 1 5 0 999999 999 0 9 9 0 0 0 0 0 0\n")
    return root


def test_a_second_of_io_pressure_and_writeback_is_reported_per_second(tmp_path: Path) -> None:
    a = host.read(10.0, _proc(tmp_path, io=(1_000, 0), cpu=0, dirty=256, sectors=0,
                              write_ms=0))
    b = host.read(12.0, _proc(tmp_path, io=(801_000, 400_000), cpu=200_000, dirty=25_600,
                              sectors=4 * 2048, write_ms=900))
    assert a is not None and b is not None
    rows = host.timeline([a, b], 10.0, 20.0)
    assert rows == [{"t": 2.0, "cpu_some_ms": 100.0, "io_some_ms": 400.0, "io_full_ms": 200.0,
                     "memory_some_ms": 0.0, "write_mb": 2.0, "write_busy_ms": 450.0,
                     "read_mb": 1.0, "read_busy_ms": 150.0,
                     "dirty_mb": 100.0, "writeback_mb": 1.0}]
    s = host.summary(rows)
    assert s["io_full_s"] == 0.2 and s["worst_io_some"] == [2.0, 400.0]
    at = host.at_stalls(rows, [(2.4, "kafka", 900.0), (2.1, "api.accept", 950.0),
                               (30.0, "sink", 400.0)], 2.0)
    assert [(x["t"], x["stages"], x["io_some_ms"]) for x in at] == [
        (2, ["api.accept", "kafka"], 400.0)]


def _task(root: Path, pid: int, tid: int, comm: str, state: str, wchan: str) -> None:
    task = root / str(pid) / "task" / str(tid)
    task.mkdir(parents=True)
    (task / "stat").write_text(f"{tid} ({comm}) {state} 1 1 1 0 -1 4194560 12 0 0 0\n")
    (task / "wchan").write_text(wchan)


def test_threads_in_uninterruptible_sleep_are_named_beside_the_stall(tmp_path: Path) -> None:
    _task(tmp_path, 40, 40, "java", "S", "futex_do_wait")
    _task(tmp_path, 40, 41, "kafka-1-raft-io", "D", "folio_wait_bit")
    _task(tmp_path, 40, 42, "data-plane-kafk", "D", "rq_qos_wait")
    _task(tmp_path, 40, 43, "data-plane-kafk", "D", "rq_qos_wait")
    _task(tmp_path, 50, 50, "python (x) y", "D", "fsync_buffers_list")
    _task(tmp_path, 60, 60, "python", "R", "0")
    found = host.blocked_threads({"kafka": 40, "send-p0": 50, "api": 60, "gone": 70}, 101.0,
                                 tmp_path)
    assert sorted((b.process, b.thread, b.wchan) for b in found) == [
        ("kafka", "data-plane-kafk", "rq_qos_wait"), ("kafka", "data-plane-kafk", "rq_qos_wait"),
        ("kafka", "kafka-1-raft-io", "folio_wait_bit"),
        ("send-p0", "python (x) y", "fsync_buffers_list")]
    held = host.blocked_timeline([*found, host.Blocked(500.0, "redis", "bio_aof_fsync", "x")],
                                 100.0, 200.0)
    assert len(held) == 4 and held[0][0] == 1.0
    assert "kafka/data-plane-kafk rq_qos_wait" in {who for _, who in held}
    rows = [{"t": 1.0, "cpu_some_ms": 0.0, "io_some_ms": 600.0}]
    at = host.at_stalls(rows, [(1.2, "sink", 900.0)], 2.0, held)
    assert at[0]["blocked"][0] == ["kafka/data-plane-kafk rq_qos_wait", 2]
    assert host.at_stalls(rows, [(9.0, "sink", 900.0)], 2.0, held) == []
    assert host.blocked_summary(held)[0] == ["kafka/data-plane-kafk rq_qos_wait", 2, 1.0, 1.0]


def test_a_thread_scan_is_triggered_by_growing_io_pressure_only(tmp_path: Path) -> None:
    (tmp_path / "pressure").mkdir()
    psi = tmp_path / "pressure" / "io"
    psi.write_text(PSI.format(some=1_000, full=0))
    watch = host.IoWatch(threshold_us=10_000, proc=tmp_path)
    assert not watch.pressed()
    psi.write_text(PSI.format(some=5_000, full=0))
    assert not watch.pressed()
    psi.write_text(PSI.format(some=25_000, full=0))
    assert watch.pressed()
    assert not watch.pressed()
    assert not host.IoWatch(proc=tmp_path / "none").pressed()


def test_a_kernel_without_pressure_accounting_gives_no_sample(tmp_path: Path) -> None:
    (tmp_path / "vmstat").write_text("nr_dirty 1\n")
    assert host.read(1.0, tmp_path) is None
    assert host.summary([]) == {"samples": 0}


def test_the_isolation_report_shows_the_machine_beside_the_stalls(tmp_path: Path) -> None:
    rows = [{"t": float(t), "cpu_some_ms": 50.0, "io_some_ms": 700.0 if t == 3 else 5.0,
             "io_full_ms": 300.0 if t == 3 else 0.0, "memory_some_ms": 0.0, "write_mb": 1.0,
             "write_busy_ms": 10.0, "dirty_mb": 40.0, "writeback_mb": 0.0} for t in range(1, 6)]
    stalls = [(3.1, "kafka", 900.0)]
    held = [(3.0, "send-p0/python fsync_buffers_list")] * 3
    mode = {"mode": "tiered", "n": 10, "otp_rate": 5, "drained": True, "wall_s": 5.0,
            "produce_rate": 1000,
            "p0": {"n": 3, "p50": 20.0, "p99": 900.0, "max": 900.0, "sent": 3, "refused": 0,
                   "missing": 0},
            "p3": {"n": 10, "p50": 900.0, "p99": 2000.0, "max": 2100.0, "missing": 0,
                   "drain_s": 2.0, "drain_rate": 5},
            "timeline": {"p0": [(3.1, 900.0)], "p3": [(0.2, 900.0)]}, "processes": {},
            "stalls": stalls,
            "host": {"summary": host.summary(rows), "timeline": rows,
                     "blocked": host.blocked_summary(held),
                     "speed": {"before": {"per_cpu_s": 41_000, "per_wall_s": 40_500},
                               "after": {"per_cpu_s": 23_000, "per_wall_s": 12_000}},
                     "at_stalls": host.at_stalls(rows, stalls, 2.0, held)}}
    md = isolation_markdown({"modes": {"tiered": mode}})
    assert "waiting on I/O 0.7 s (all tasks at once 0.3 s; worst second 700 ms at 3 s)" in md
    assert "3 s: I/O 700/300 ms, core 50 ms, dirty 40 MB" in md
    assert "send-p0/python fsync_buffers_list x3 (3-3 s)" in md
    assert ("before the load 41,000 rounds per CPU second (40,500 per wall second), after the "
            "load 23,000") in md
    assert "[send-p0/python fsync_buffers_list x3]" in md
    png = isolation_plot({"modes": {"tiered": mode, "shared": {**mode, "mode": "shared"}}},
                         tmp_path / "iso.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_machine_speed_is_rounds_of_a_fixed_workload_per_second() -> None:
    assert calibrate.one_round() == calibrate.one_round() > 64
    speed = calibrate.speed(0.05)
    assert speed["rounds"] >= 100 and speed["rounds"] % 100 == 0
    assert 0 < speed["per_wall_s"] <= speed["per_cpu_s"] * 1.2


def test_the_machine_cpu_between_two_samples_counts_busy_and_idle(tmp_path: Path) -> None:
    from notiflow.bench.harness import Sampler

    hz = os.sysconf("SC_CLK_TCK")
    root = _proc(tmp_path, io=(0, 0), cpu=0, dirty=0, sectors=0, write_ms=0)
    sampler = Sampler()
    assert sampler.machine_between(0.0, 9.0) is None
    for at, (user, nice, system, idle, iowait, softirq) in (
            (1.0, (100, 0, 10, 500, 5, 1)), (5.0, (100, 0, 10, 500, 5, 1)),
            (9.0, (100 + 3 * hz, 2 * hz, 10 + hz, 500 + 2 * hz, 5, 1))):
        (root / "stat").write_text(
            f"cpu  {user} {nice} {system} {idle} {iowait} 0 {softirq} 0 0 0\n"
            "cpu0 1 2 3 4 5 6 7 8 9 10\n")
        sample = host.read(at, root)
        assert sample is not None
        sampler.host_samples.append(sample)
    assert sampler.machine_between(5.2, 8.9) == (6.0, 2.0)
    assert sampler.machine_between(5.5, 6.5) == (6.0, 2.0), "a window inside one interval"
    assert sampler.machine_between(8.0, 4.0) is None
