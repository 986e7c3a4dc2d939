"""The command line ends bad situations in one line on stderr and an exit status, never a traceback:
an unusable --device, Ctrl-C, a full disk; and `parley --help` does not pay for importing torch."""

from __future__ import annotations

import errno
import subprocess
import sys

import pytest

from parley.app import cli, generate


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize("device", ["tpu", "xla", "nonsense"])
def test_unsupported_device(capsys, device):
    assert cli.main(["generate", "hi", "--device", device]) == 2
    assert f"--device {device}" in one_line_error(capsys)


def test_auto_device_is_accepted(capsys, monkeypatch):
    """`bench kernels` defaults to --device auto: the device check must let it through to the command."""
    from parley.bench import kernels as bench_kernels

    seen = []
    monkeypatch.setattr(bench_kernels, "run", lambda args: seen.append(args.device) or 0)
    assert cli.main(["bench", "kernels"]) == 0 and seen == ["auto"]


def test_cuda_without_cuda(capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cli.main(["quantize", "--device", "cuda"]) == 2
    assert "use --device cpu" in one_line_error(capsys)


def test_ctrl_c(capsys, monkeypatch):
    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(generate, "run", interrupted)
    assert cli.main(["generate", "hi"]) == 130
    assert "interrupted" in one_line_error(capsys)


def test_disk_full(capsys, monkeypatch):
    def full(args):
        raise OSError(errno.ENOSPC, "No space left on device", "/cache/awq/x/model.safetensors")

    monkeypatch.setattr(generate, "run", full)
    assert cli.main(["generate", "hi"]) == 1
    assert "disk is full writing /cache/awq/x/model.safetensors" in one_line_error(capsys)


def test_other_os_errors_are_not_disguised(monkeypatch):
    def bug(args):
        raise OSError(errno.EBADF, "Bad file descriptor")

    monkeypatch.setattr(generate, "run", bug)
    with pytest.raises(OSError):
        cli.main(["generate", "hi"])


@pytest.mark.parametrize("argv", [["--help"], ["bench", "--help"], ["quantize", "--help"], ["chat", "--help"]])
def test_help_does_not_import_torch(argv):
    code = (f"import sys\nfrom parley.app.cli import main\ntry:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
            "print('torch' in sys.modules, 'textual' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip().splitlines()[-1] == "False False", out.stdout + out.stderr
