"""The public API (`import specwire`): small, lazy, and the names the README's examples use."""

from __future__ import annotations

import inspect
import subprocess
import sys

import specwire


def test_every_public_name_resolves():
    for name in specwire.__all__:
        assert getattr(specwire, name) is not None, name
    assert set(specwire.__all__) >= {"load_target", "load_draft", "speculative_generate", "train", "evaluate", "Wiring",
                                     "diagnose", "SpecConfig", "TrainConfig", "DoctorConfig"}


def test_import_is_lazy():
    code = "import sys, specwire; print(sorted(m for m in sys.modules if m.startswith('specwire.')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out  # nothing beyond the package itself until a name is used


def test_the_readme_calls_match_the_signatures():
    params = lambda f: inspect.signature(f).parameters  # noqa: E731
    assert {"max_new_tokens", "spec", "params", "generator"} <= set(params(specwire.speculative_generate))
    assert list(params(specwire.diagnose))[:3] == ["draft_path", "target", "config"]
    assert list(params(specwire.evaluate))[:2] == ["draft", "data"]
    assert list(params(specwire.train))[:1] == ["config"]
    assert specwire.TrainConfig(data="d", out="o").data == "d"
    assert specwire.SpecConfig(budget="fixed", num_steps=5, topk=4).num_draft_tokens >= 1


def test_unknown_name_is_an_attribute_error():
    try:
        specwire.no_such_name
    except AttributeError as e:
        assert "no_such_name" in str(e)
    else:
        raise AssertionError("expected AttributeError")
