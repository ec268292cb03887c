"""Ctrl-C while TensorFlow runs native code: the process ends after a grace period instead of never."""

from __future__ import annotations

import sys
import time

INTERRUPT_GRACE = {"seconds": 1.0}  # how long Python gets after Ctrl-C; a second Ctrl-C ends at once


def exit_on_interrupt_in_native_code() -> None:
    """Make Ctrl-C work while TensorFlow runs native code (an endless ``tf.while_loop`` in a rule never returns
    to Python, so KeyboardInterrupt is never raised). The C signal handler still writes to the wakeup fd: a
    watcher thread gives Python ``INTERRUPT_GRACE`` seconds to raise KeyboardInterrupt and finish (an
    evaluation writes its report), then ends the process (status 130); a second Ctrl-C ends it at once. Writes
    are atomic, so nothing half-written is left. Main thread of a real process only."""
    import os
    import select
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is not (
        signal.default_int_handler
    ):
        return
    try:
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)
        signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    except (OSError, ValueError):  # no pipes, or a wakeup fd someone else owns
        return

    def watch() -> None:
        while True:
            data = os.read(read_fd, 64)
            if signal.SIGINT in data:
                deadline = time.monotonic() + INTERRUPT_GRACE["seconds"]
                while (left := deadline - time.monotonic()) > 0:
                    ready, _, _ = select.select([read_fd], [], [], left)
                    if ready and signal.SIGINT in os.read(read_fd, 64):
                        break  # a second Ctrl-C: the user does not want to wait
                print("\ngradscope: interrupted (native code did not return)", file=sys.stderr, flush=True)
                os._exit(130)

    threading.Thread(target=watch, name="gradscope-interrupt", daemon=True).start()
