"""A folder quantized by one method is never loaded as another's: the method (rotation, GPTQ, act-order, scale
refit, down_proj's AWQ scale, the rotated down_proj beside the folder) is part of the cache key, so changing what
the first run ships rebuilds instead of trusting an old folder."""

import torch
from awq_tiny import outlier_model, write_hf_dir

from parley.models.quantize import cache, methods
from parley.models.quantize.awq import AWQSettings
from parley.models.quantize.distill import DistillSettings
from parley.models.resolve import resolve


def test_each_method_gets_its_own_folder(tmp_path, monkeypatch):
    source = resolve(str(write_hf_dir(outlier_model(), tmp_path / "tiny")))
    built = []
    monkeypatch.setattr(cache, "build", lambda files, key, folder, *a: built.append((key, folder)))
    by_name = {"awq": AWQSettings(), "rotate+awq+gptq": AWQSettings(rotate=True, gptq=True),
               "rotate+awq+gptq-act-order": AWQSettings(rotate=True, gptq=True, act_order=True),
               "rotate+awq+gptq+refit": AWQSettings(rotate=True, gptq=True, refit_scales=True),
               "rotate+awq-no-down-scale+gptq+refit": AWQSettings(rotate=True, gptq=True, refit_scales=True,
                                                                  scale_down=False),
               "rotate+awq+clip-qk+gptq": AWQSettings(rotate=True, gptq=True, clip_qk=True),
               "rotate+awq+gptq+refit+hadamard-down256": AWQSettings(rotate=True, gptq=True, refit_scales=True,
                                                                     hadamard_down=256),
               "rotate+awq+gptq+refit+hadamard-down256+distill": AWQSettings(
                   rotate=True, gptq=True, refit_scales=True, hadamard_down=256, distill=DistillSettings())}
    for settings in by_name.values():
        monkeypatch.setattr(methods, "first_run_settings", lambda group_size, device, s=settings: s)
        cache.ensure_quantized(source, group_size=32, calib="builtin", n_samples=2, seq_len=16, device="cpu")
    assert [key["settings"]["method"] for key, _ in built] == list(by_name)
    assert len({folder for _, folder in built}) == len(by_name)


def test_the_first_run_method_is_in_the_key():
    s = methods.first_run_settings(64, torch.device("cpu"))
    assert methods.method_name(s) == "rotate+awq-no-down-scale+clip-qk+gptq+refit+hadamard-down256+distill"
    assert s.rotate and s.gptq and s.refit_scales and not s.scale_down and not s.act_order and s.hadamard_down == 256
    assert s.clip and s.clip_qk and s.distill is not None
