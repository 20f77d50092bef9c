import pytest
import torch

from pipeline.models import MODELS, build_model, count_params


@pytest.mark.parametrize("name,params", [("lenet", 129_068), ("resnet18", 11_175_818)])
def test_parameter_counts_match_d2l(name, params):
    assert count_params(MODELS[name]()) == params


@pytest.mark.parametrize("name", list(MODELS))
def test_output_shape(name):
    assert build_model(name, 0)(torch.zeros(3, 1, 28, 28)).shape == (3, 10)


def test_resnet_is_cifar_style_stem_without_maxpool():
    m = build_model("resnet18", 0)
    assert m[0].kernel_size == (3, 3) and m[0].stride == (1, 1)
    assert not any(isinstance(x, torch.nn.MaxPool2d) for x in m.modules())


def test_same_seed_same_weights_different_seed_different():
    a, b, c = (build_model("lenet", s).state_dict() for s in (0, 0, 1))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_d2l_init_draws_small_normal_weights():
    m = build_model("lenet", 0, init="d2l")
    w = m[7].weight  # fc 800 -> 128
    assert abs(w.std().item() - 0.01) < 0.001
    assert build_model("lenet", 0)[7].weight.std().item() > 0.015  # PyTorch's default is wider


def test_the_registry_names_d2ls_models_as_pipeline_models_builds_them():
    """pipeline/zoo.py's D2L (torch-free: the configuration's, the CLI's and `fit --count-ahead`'s) is
    pipeline/models.py's MODELS, in its order."""
    from pipeline import zoo

    assert zoo.D2L == tuple(MODELS)
