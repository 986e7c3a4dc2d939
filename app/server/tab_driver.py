"""The web driver a browser tab's chat app runs on (`parley web`): it ends the app when its tab goes."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading

from textual.drivers.web_driver import WebDriver

# Once told to go (the tab closed, the browser or `parley web` gone, SIGTERM), a tab's process leaves within
# this even when something in it does not wind down: nobody is left to show it to.
LEAVE_WITHIN_S = 1.5


class TabDriver(WebDriver):
    """Textual's web driver, made to leave when its tab goes.

    Textual's own keeps running when its stdin closes (the browser was killed, or `parley web` was): the input
    thread ends and nothing else notices, so the app renders on for nobody. Here the end of input, the
    server's `quit` and SIGTERM/SIGINT all quit the app the usual way (a reply in flight is saved, marked
    interrupted) and, should that not finish in `LEAVE_WITHIN_S`, end the process.
    """

    _leaving = False

    def start_application_mode(self) -> None:
        super().start_application_mode()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, self.leave)

    def on_meta(self, packet_type: str, payload: dict[str, object]) -> None:
        if packet_type == "quit":
            self.leave()
        else:
            super().on_meta(packet_type, payload)

    def run_input_thread(self) -> None:
        super().run_input_thread()
        if not self.exit_event.is_set():  # input ended while the app still runs: the tab is gone
            self.leave()

    def leave(self) -> None:
        """Quit the app now (from any thread); end the process if that has not happened in time."""
        if self._leaving:
            return
        self._leaving = True
        timer = threading.Timer(LEAVE_WITHIN_S, os._exit, (0,))
        timer.daemon = True
        timer.start()
        app = self._app
        with contextlib.suppress(AttributeError, RuntimeError):  # no loop any more: the timer ends the process
            app._loop.call_soon_threadsafe(lambda: asyncio.ensure_future(app.run_action("quit")))
