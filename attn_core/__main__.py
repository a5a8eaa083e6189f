"""``python -m attn_core`` and the ``attn-lab`` script: the signal handlers of the CLI process are
installed first, before the CLI's modules (typer, and through them torch) load, so Ctrl-C (or
SIGTERM, SIGHUP) at any moment of start-up ends the process with the one line ``interrupted``
and the status 128 + the signal (``training.interrupt.CliSignals``; until that module has
loaded, the few lines below)."""

import os
import signal
import sys


def _early(signum, frame) -> None:  # only os and sys here: nothing else has loaded yet
    if "--json" in sys.argv:
        os.write(1, b'{"error": "interrupted", "kind": "interrupted"}\n')
    os.write(2, b"interrupted\n")
    os._exit(128 + signum)


def main() -> None:
    for name in ("SIGINT", "SIGTERM", "SIGHUP"):
        sig = getattr(signal, name, None)
        if sig is not None and signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, _early)
    from attn_core.training.interrupt import CliSignals

    signals = CliSignals(process=True).install()
    try:
        from attn_core.cli import main as cli_main

        cli_main(signals=signals)
    except KeyboardInterrupt:  # never to the interpreter, which would print it and end by SIGINT
        signals.signum = signals.signum or signal.SIGINT
        signals.line()
        signals.code, signals.phase = 128 + signals.signum, "exit"
        sys.exit(signals.code)


if __name__ == "__main__":
    main()
