"""Fixtures shared across test areas."""
from __future__ import annotations

import functools
import http.server
import os
import threading
from pathlib import Path

import pytest
import torch

# the raw-data root of every problem that reads raw files (ptb/, multi30k/), as the benchmarks use it
os.environ.setdefault("HOTLOOP_RAW_ROOT", str(Path(__file__).resolve().parents[1].parent / "shared" / "data"))


@pytest.fixture
def one_thread():
    """One intra-op thread for the test (the cores are shared: less load, the same kernels every run)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def http_dir(tmp_path):
    """Serve ``tmp_path/www`` on 127.0.0.1 (never the internet); yields ``(root, base_url)``."""
    root = tmp_path / "www"
    root.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *a, **k: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()
    thread.join(5)
