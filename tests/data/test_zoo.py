"""The model registry (pipeline/zoo.py, pipeline/models.py): torchvision's classifiers by name, adapted to 1x28x28;
a user's model through the entry point; a typo or a module path refused with the fix."""

import pytest
import torch

from pipeline import zoo
from pipeline.config import ConfigError
from pipeline.models import blocks, build_meta, build_model, count_params


def test_a_torchvision_model_builds_by_name_and_trains_on_a_28x28_batch():
    m = build_model("mobilenet_v3_small", 0)
    out = m(torch.zeros(4, 1, 28, 28))
    assert out.shape == (4, 10)
    out.sum().backward()
    assert zoo.kind("mobilenet_v3_small") == "torchvision"
    assert zoo.source("mobilenet_v3_small").startswith("torchvision ")
    assert zoo.adaptation("mobilenet_v3_small") == "gray repeated to 3 channels, 28x28 as is"


def test_a_model_with_a_minimum_size_is_resized_to_it():
    """vit_b_16 takes 224x224 (its weights' min_size): the adaptation says so, and the model built on meta takes a
    1x28x28 batch through it."""
    assert zoo.adaptation("vit_b_16") == "gray repeated to 3 channels, resized to 224x224 (bilinear)"
    m = build_meta("vit_b_16")
    assert m(torch.zeros(2, 1, 28, 28, device="meta")).shape == (2, 10)


def test_the_d2l_models_stay_d2ls():
    assert zoo.kind("resnet18") == "d2l" and zoo.source("resnet18") == "d2l"
    assert count_params(build_model("resnet18", 0)) == 11_175_818


def test_fsdp_units_of_a_torchvision_model_are_its_stages_blocks():
    """The one rule (models.blocks): resnet50's stem, its 16 bottlenecks and its head; a ViT's encoder blocks."""
    names = [n for n, _ in blocks(build_meta("resnet50"))]
    assert names[:2] == ["1.conv1", "1.bn1"] and names[-1] == "1.fc"
    assert sum(n.startswith("1.layer") for n in names) == 16
    vit = [n for n, _ in blocks(build_meta("vit_b_16"))]
    assert sum(n.startswith("1.encoder.layers.") for n in vit) == 12


def test_a_typo_is_refused_with_did_you_mean(make_cfg):
    with pytest.raises(ConfigError, match="Did you mean `mobilenet_v3_small`"):
        make_cfg("train.model=mobilenet_v3_smal")
    with pytest.raises(ConfigError, match=r"sweep\.spaces\.ddp\.model.*Did you mean `resnet50`"):
        make_cfg("sweep.spaces.ddp.model=[resnet5]")


def test_a_module_path_in_params_is_refused_and_nothing_imported(make_cfg, tmp_path):
    (tmp_path / "params.yaml").write_text("train:\n  model: os.path:join\n")
    with pytest.raises(ConfigError, match="names a model, never code.*parallax.models"):
        make_cfg()


def test_torchvision_names_are_accepted_in_train_and_spaces(make_cfg):
    assert make_cfg("train.model=resnet50").train.model == "resnet50"
    cfg = make_cfg("sweep.spaces.fsdp.model=[mobilenet_v3_small,lenet]")
    assert cfg.sweep.spaces["fsdp"][0].model == ("mobilenet_v3_small", "lenet")


def test_an_installed_packages_model_is_found_through_the_entry_point(toy_model, make_cfg):
    assert zoo.kind(toy_model) == "entry point"
    assert zoo.source(toy_model) == "entry point toymodels:build_toynet (toymodels 0.1)"
    assert toy_model in zoo.names()
    m = build_model(toy_model, 0)
    assert m(torch.zeros(2, 1, 28, 28)).shape == (2, 10)
    assert [n for n, _ in blocks(m)] == ["0", "4"]
    assert make_cfg(f"train.model={toy_model}").train.model == toy_model


def test_the_models_command_lists_source_parameters_and_units(toy_model, tmp_path, monkeypatch, capsys):
    from pipeline.cli.commands import main

    monkeypatch.setenv("DVC_ROOT", str(tmp_path))  # its cache: tmp_path/runs/memory_model.json
    assert main(["models", "lenet", "mobilenet_v3_small", toy_model]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split() == ["lenet", "129,068", "4", "d2l"]
    assert lines[2].split()[:4] == ["mobilenet_v3_small", "1,528,106", "15", "torchvision"]
    assert lines[3].split()[:4] == [toy_model, "170", "2", "entry"]
    assert "toymodels:build_toynet (toymodels 0.1)" in lines[3]
    with pytest.raises(SystemExit):
        main(["models", "--help"])
    assert "parallax.models" in capsys.readouterr().out
