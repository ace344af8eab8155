"""Available memory inside a container: the memory cgroup's limit binds where it is tighter
than the host's ``MemAvailable`` (tfgraph.io.available_memory, read by the weight, run and
generate memory checks)."""

from __future__ import annotations

from pathlib import Path

from tfgraph import io

GB = 10**9


def _files(folder: Path, **files: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name.replace("_", ".", 1)).write_text(text, encoding="ascii")


def test_cgroup_v2_limit_less_usage_plus_inactive_cache_tightest_ancestor(tmp_path: Path):
    root = tmp_path / "cg"
    _files(root, memory_max="max", memory_current=str(50 * GB), memory_stat="anon 1\n")
    _files(root / "box", memory_max=str(8 * GB), memory_current=str(5 * GB),
           memory_stat=f"anon {3 * GB}\ninactive_file {GB}\nactive_file 7\n")
    _files(root / "box" / "job", memory_max="max", memory_current=str(5 * GB),
           memory_stat="inactive_file 0\n")
    membership = tmp_path / "cgroup"
    membership.write_text("0::/box/job\n", encoding="ascii")
    assert io.cgroup_available(str(root), str(membership)) == 8 * GB - 5 * GB + GB
    _files(root / "box" / "job", memory_max=str(2 * GB))  # the job's own limit is tighter
    assert io.cgroup_available(str(root), str(membership)) == 0  # over its limit already
    membership.write_text("0::/\n", encoding="ascii")  # the root alone: no limit
    assert io.cgroup_available(str(root), str(membership)) is None


def test_cgroup_v1_limit_and_no_limit(tmp_path: Path):
    memory = tmp_path / "cg" / "memory"
    _files(memory, memory_limit_in_bytes=str(4 * GB), memory_usage_in_bytes=str(3 * GB),
           memory_stat=f"cache 9\ntotal_inactive_file {GB // 2}\n")
    assert io.cgroup_available(str(tmp_path / "cg")) == GB + GB // 2
    _files(memory, memory_limit_in_bytes="9223372036854771712")  # v1's "no limit"
    assert io.cgroup_available(str(tmp_path / "cg")) is None


def test_available_memory_takes_the_tighter_of_host_and_cgroup(monkeypatch):
    monkeypatch.setattr(io, "_meminfo_available", lambda: 20 * GB)
    monkeypatch.setattr(io, "cgroup_available", lambda: 3 * GB)
    assert io.available_memory() == 3 * GB
    monkeypatch.setattr(io, "cgroup_available", lambda: None)
    assert io.available_memory() == 20 * GB
    monkeypatch.setattr(io, "_meminfo_available", lambda: None)
    assert io.available_memory() is None
