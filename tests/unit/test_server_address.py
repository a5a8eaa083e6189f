"""A fresh `streamlit run app.py` listens on the loopback interface only: a dashboard that can start
jobs and read every run answers this machine until its owner passes ``--server.address``."""

import ipaddress
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from benchmarks.dashboard import free_port

ROOT = Path(__file__).resolve().parents[2]


def listening_addresses(port: int) -> set[str]:
    """The local addresses of the sockets listening on ``port`` (IPv4 and IPv6), read from
    /proc/net: ``127.0.0.1``, ``0.0.0.0``, ``::`` and so on."""
    found = set()
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        if not os.path.exists(table):
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            address, hex_port = fields[1].split(":")
            if int(hex_port, 16) != port or fields[3] != "0A":  # 0A: LISTEN
                continue
            raw = bytes.fromhex(address)
            if width == 8:
                found.add(".".join(str(b) for b in reversed(raw)))
            else:  # four little-endian 32-bit words
                words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
                found.add(str(ipaddress.IPv6Address(words)))
    return found


def test_the_shipped_config_binds_the_dashboard_to_loopback():
    text = (ROOT / ".streamlit" / "config.toml").read_text()
    server = re.search(r"^\[server\]$(.*?)(^\[|\Z)", text, re.M | re.S)
    assert server and re.search(r'^address = "127\.0\.0\.1"$', server.group(1), re.M)


def test_a_fresh_server_listens_on_loopback_only(tmp_path):
    port = free_port()
    env = dict(os.environ, ATTN_LAB_RUNS=str(tmp_path / "runs"))
    cmd = [sys.executable, "-m", "streamlit", "run", "app.py", "--server.headless", "true"]
    cmd += ["--server.port", str(port), "--server.fileWatcherType", "none"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, "streamlit exited before it served"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "streamlit did not answer on 127.0.0.1 in 120 s"
            time.sleep(0.3)
        assert listening_addresses(port) == {"127.0.0.1"}
    finally:
        proc.terminate()
        proc.wait(timeout=30)
