"""`parley web`: only requests addressed to 127.0.0.1/localhost, from no page but its own, reach the app (a
DNS-rebinding page or another site's websocket would drive a chat); the `--server` key goes to the tabs by the
environment, never on their command line (`ps`) nor in textual-serve's banner, which prints that command."""

from __future__ import annotations

import asyncio
import os

import pytest
from aiohttp import web as aioweb
from aiohttp.test_utils import TestClient, TestServer

from parley.app import cli
from parley.app.server import web


async def page(request: aioweb.Request) -> aioweb.Response:
    return aioweb.Response(text="app")


def statuses(port: int, cases: list[dict[str, str]]) -> list[int]:
    async def main() -> list[int]:
        app = aioweb.Application(middlewares=[web.guard(port)])
        app.router.add_get("/ws", page)
        async with TestClient(TestServer(app)) as client:
            out = []
            for headers in cases:
                resp = await client.get("/ws", headers=headers)
                out.append(resp.status)
            return out
    return asyncio.run(main())


def test_only_this_machine_and_its_own_page_reach_the_app():
    port = 8123
    ok = [{"Host": f"127.0.0.1:{port}"}, {"Host": f"localhost:{port}", "Origin": f"http://localhost:{port}"},
          {"Host": f"127.0.0.1:{port}", "Origin": f"http://127.0.0.1:{port}"}]
    refused = [{"Host": f"attacker.example:{port}"}, {"Host": f"127.0.0.1:{port}", "Origin": "https://attacker.example"},
               {"Host": f"127.0.0.1:{port}", "Origin": f"http://127.0.0.1:{port + 1}"},
               {"Host": f"127.0.0.1:{port}", "Origin": "null"}]
    assert statuses(port, ok + refused) == [200] * len(ok) + [403] * len(refused)


def test_the_server_key_goes_by_the_environment(tmp_path, monkeypatch):
    key_file = tmp_path / "key"
    key_file.write_text("sk-web-secret-9\n")
    monkeypatch.setenv("PARLEY_API_KEY", "")  # `parley web` sets it: undone after the test (not left for the next
    monkeypatch.delenv("PARLEY_API_KEY")  # test's subprocesses, whose servers would then ask for the key)
    seen = {}
    monkeypatch.setattr(web, "serve", lambda command, port: seen.update(command=command,
                                                                        key=os.environ.get("PARLEY_API_KEY")))
    monkeypatch.setattr(web.tui, "exit_now", lambda status: None)
    assert cli.main(["web", "--server", "http://127.0.0.1:9/v1", "--api-key-file", str(key_file)]) == 0
    assert seen["key"] == "sk-web-secret-9"
    assert "sk-web-secret-9" not in seen["command"] and "api-key" not in seen["command"]


def test_a_key_on_the_web_command_line_is_refused(capsys, monkeypatch):
    monkeypatch.setattr(web, "serve", lambda command, port: pytest.fail("served with a key on argv"))
    assert cli.main(["web", "--server", "http://127.0.0.1:9/v1", "--api-key", "sk-web-secret-9"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "sk-web-secret-9" not in err and "PARLEY_API_KEY" in err
