"""bench.nativeprof: a process's CPU by binary, from perf."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench import nativeprof, profiling
from tests.support import is_compiled

# ``perf report --sort dso --stdio --no-children -g none`` of a gateway under small GETs.
REPORT = """\
# Samples: 2K of event 'cpu-clock:pppH'
#
# Overhead  Shared Object
# ........  ........................................
#
    69.22%  libpython3.11.so.1.0
    12.37%  [kernel.kallsyms]
     5.61%  libcrypto.so.3
     5.19%  libc.so.6
     4.71%  loop.cpython-311-x86_64-linux-gnu.so
     1.86%  libssl.so.3
     0.43%  [vdso]
     0.29%  _asyncio.cpython-311-x86_64-linux-gnu.so
     0.19%  _ssl.cpython-311-x86_64-linux-gnu.so
     0.13%  libffi.so.8
"""


def test_a_perf_report_is_grouped_by_what_the_binaries_do() -> None:
    assert nativeprof.group_report(REPORT) == [
        ("Python interpreter", 69.2),
        ("kernel (syscalls, TCP, scheduler)", 12.4),
        ("OpenSSL (TLS)", 7.7),
        ("libc (copies, malloc, clocks)", 5.6),
        ("uvloop", 4.7),
        ("other C extensions", 0.3),
        ("other", 0.1),
    ]


def test_the_summary_turns_shares_into_microseconds_per_operation() -> None:
    line = nativeprof.summary_line([("Python interpreter", 80.0), ("kernel", 20.0)], 150.0)
    assert line == "Python interpreter 80.0% 120.0 us; kernel 20.0% 30.0 us"


@pytest.mark.skipif(nativeprof.unavailable() is not None,
                    reason=f"perf cannot sample here: {nativeprof.unavailable()}")
def test_perf_finds_a_busy_python_process_in_the_interpreter(tmp_path: Path) -> None:
    busy = subprocess.Popen(
        [sys.executable, "-c", "import time\nend = time.time() + 3\nwhile time.time() < end: pass"])
    try:
        time.sleep(0.2)
        data = tmp_path / "busy.perf.data"
        nativeprof.start(busy.pid, 1, data).wait(30)
        found = nativeprof.result(data)
    finally:
        busy.kill()
        busy.wait()
    assert "pct" in found, found
    shares = dict(found["pct"])
    assert shares.get("Python interpreter", 0.0) > 50.0, found
    assert os.path.exists(found["file"])


# mypyc's C names, as perf finds them in the compiled request path.
COMPILED = nativeprof.compiled_modules()


@pytest.mark.parametrize(("symbol", "module"), [
    ("CPyDef_agent___exchange___HttpExchange____setup_now", "gateway.agent.exchange"),
    ("CPyDef_hub___exchange___Exchange____relay_whole", "gateway.hub.exchange"),
    ("CPyDef_agent___Agent____kube_exchange", "gateway.agent.agent"),
    ("CPyPy_connection___TunnelSession___buffer_updated", "tunnel.connection"),
    ("CPyDef_frames___decode_frames_gen_____mypyc_generator_helper__", "tunnel.frames"),
    ("CPyDef_chain___start_admission", "gateway.hub.admission.chain"),
    ("CPyDef_ops___metrics___Histogram___observe", "gateway.ops.metrics"),
    ("CPyDef_audit___request_line", "gateway.ops.audit"),
    ("CPyDef_session_state___Session___receive", "tunnel.session_state"),
    ("PyObject_VectorcallMethod", None),
    ("CPyDef_nosuchmodule___f", None),
])
def test_a_compiled_symbol_names_its_module(symbol: str, module: str | None) -> None:
    assert nativeprof.compiled_module(symbol, COMPILED) == module


def test_a_compiled_symbol_reads_as_a_function_of_its_file() -> None:
    assert nativeprof.function_name("CPyDef_agent___exchange___HttpExchange____setup_now",
                                    "gateway.agent.exchange") == \
        "HttpExchange._setup_now (gateway/agent/exchange.py)"
    assert nativeprof.function_name("CPyDef_audit___request_line", "gateway.ops.audit") == \
        "request_line (gateway/ops/audit.py)"


# ``perf script --fields ip,sym,dso``: one sample per block, innermost frame first.
SCRIPT = """\
\tffffffff81e2eed9 tcp_sendmsg ([kernel.kallsyms])
\tf838f __GI___libc_write (/lib/libc.so.6)
\ta3902 __pyx_f_6uvloop_4loop_8UVStream__try_write (/x/loop.cpython-311.so)
\t10ca6c CPyDef_h2pool___H2Upstream____write_now (/x/hubproxy_compiled__mypyc.so)

\t246490 CRYPTO_gcm128_encrypt_ctr32 (/lib/libcrypto.so.3)
\t10373d SSL_write_ex (/lib/libssl.so.3)
\t10ca6c CPyDef_h2pool___H2Upstream____write_now (/x/hubproxy_compiled__mypyc.so)

\tfa8f6 unicodekeys_lookup_unicode (/x/libpython3.11.so.1.0)
\tfd280 CPyDef_agent___exchange___rewrite_request_block (/x/hubproxy_compiled__mypyc.so)
\tfd780 CPyDef_agent___exchange___HttpExchange____setup_now (/x/hubproxy_compiled__mypyc.so)
\t331b11 CPyDef_connection___TunnelSession___buffer_updated (/x/hubproxy_compiled__mypyc.so)

\te49c2 CPyDef_http1___serialize_response_fields (/x/hubproxy_compiled__mypyc.so)
\tfd780 CPyDef_agent___exchange___HttpExchange____setup_now (/x/hubproxy_compiled__mypyc.so)

\t158cc7 PyObject_VectorcallMethod (/x/libpython3.11.so.1.0)
\t7784e __pyx_f_6uvloop_4loop_11SSLProtocol__process_outgoing (/x/loop.cpython-311.so)
\t331b11 CPyDef_connection___TunnelSession___buffer_updated (/x/hubproxy_compiled__mypyc.so)

\t158cc7 _PyEval_EvalFrameDefault (/x/libpython3.11.so.1.0)
\t158cc7 _PyEval_Vector (/x/libpython3.11.so.1.0)
"""


def test_a_sample_counts_in_the_layer_of_its_innermost_frame_of_ours() -> None:
    found = nativeprof.attribute(nativeprof.samples(SCRIPT), COMPILED,
                                 profiling.layer_of_path)
    assert found["samples"] == 6
    # A syscall and TLS stay theirs, whoever asked; the interpreter's work for a compiled
    # function is that function's layer; uvloop's C before any frame of ours is the loop's.
    assert dict(found["layer_pct"]) == {
        "kernel (syscalls, TCP, scheduler)": 16.7,
        "TLS (OpenSSL)": 16.7,
        "agent request handling": 16.7,
        "HTTP wire (HTTP/1.1, HTTP/2, HPACK)": 16.7,
        nativeprof.EVENT_LOOP_LAYER: 16.7,
        "Python interpreter": 16.7,
    }
    # Own work: only the samples of our layers, each for its innermost function of ours.
    assert dict(found["innermost_pct"]) == {
        "rewrite_request_block (gateway/agent/exchange.py)": 16.7,
        "serialize_response_fields (gateway/wire/http1.py)": 16.7,
    }
    inclusive = dict(found["inclusive_pct"])
    assert inclusive["H2Upstream._write_now (gateway/agent/h2pool.py)"] == 33.3
    assert inclusive["HttpExchange._setup_now (gateway/agent/exchange.py)"] == 33.3
    assert inclusive["TunnelSession.buffer_updated (tunnel/connection.py)"] == 33.3


@pytest.mark.skipif(nativeprof.unavailable() is not None,
                    reason=f"perf cannot sample here: {nativeprof.unavailable()}")
def test_perf_stacks_see_into_the_compiled_request_path(tmp_path: Path) -> None:
    # py-spy sees a compiled function as the Python line that called it; perf's stacks name
    # it: a process parsing request heads in a loop spends its time in the HTTP wire layer.
    import gateway.wire.http1 as http1
    if not is_compiled(http1):
        pytest.skip("gateway.wire.http1 is not compiled in this install")
    busy = subprocess.Popen([sys.executable, "-c", (
        "import time\n"
        "from gateway.wire.http1 import KUBECTL_GET_HEAD, Limits, parse_request_head\n"
        "limits = Limits()\n"
        "end = time.time() + 4\n"
        "while time.time() < end:\n"
        "    for _ in range(1000): parse_request_head(KUBECTL_GET_HEAD, limits)\n")],
        cwd=Path(__file__).resolve().parents[2])
    try:
        time.sleep(0.5)
        data = tmp_path / "busy.perf.data"
        nativeprof.start(busy.pid, 1, data).wait(30)
        found = nativeprof.result(data, profiling.layer_of_path)
    finally:
        busy.kill()
        busy.wait()
    stacks = found["stacks"]
    assert isinstance(stacks, dict), found
    layers = dict(stacks["layer_pct"])
    assert layers.get("HTTP wire (HTTP/1.1, HTTP/2, HPACK)", 0.0) > 50.0, stacks
    assert "parse_request_head (gateway/wire/http1.py)" in dict(stacks["inclusive_pct"]), stacks
