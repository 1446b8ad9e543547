"""The CPU name read from /proc/cpuinfo carries the x86 family and model: VMs name only the line."""
from __future__ import annotations

from pathlib import Path

from hotloop.ops.cpu_isa import _cpuinfo

_TWO_CPUS = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 26
model\t\t: 2
model name\t: AMD EPYC
flags\t\t: fpu avx2 avx512f avx512_bf16

processor\t: 1
cpu family\t: 25
model\t\t: 17
model name\t: Other CPU
flags\t\t: fpu amx_tile
"""


def test_the_first_cpu_names_its_family_and_model(tmp_path: Path) -> None:
    path = tmp_path / "cpuinfo"
    path.write_text(_TWO_CPUS)
    flags, model = _cpuinfo(str(path))
    assert model == "AMD EPYC (family 26, model 2)"
    assert flags == {"fpu", "avx2", "avx512f", "avx512_bf16"}           # the first CPU's block only


def test_no_family_leaves_the_name_and_no_file_gives_no_flags(tmp_path: Path) -> None:
    path = tmp_path / "cpuinfo"
    path.write_text("model name\t: Some ARM\nflags\t: neon\n")
    assert _cpuinfo(str(path)) == ({"neon"}, "Some ARM")
    flags, model = _cpuinfo(str(tmp_path / "missing"))
    assert flags == set() and model
