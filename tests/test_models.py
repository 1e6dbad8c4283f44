import pytest
import torch

from cs336_systems.factory import build_model, count_parameters_for
from cs336_systems.layers import naive_causal_attention, sdpa_causal_attention
from cs336_systems.models import (
    SIZE_TABLES,
    ConfigError,
    ModelConfig,
    TransformerLM,
    count_parameters,
    formula_num_params,
)
from cs336_systems.user_model import ModelFactoryError, check_model_output, load_model_factory
from tests.helpers import tiny_model_config

# docs/reference.md section 1, V = 10,000
PUBLISHED_PARAMS = {
    "small": 128_625_408,
    "medium": 423_183_360,
    "large": 969_411_840,
    "xl": 1_998_235_200,
    "2.7B": 3_406_809_600,
}


@pytest.mark.parametrize("size", list(SIZE_TABLES["2025"]))
def test_parameter_counts_match_formula_and_reference(size):
    config = ModelConfig.from_size(size, "2025")
    counted = count_parameters_for(config)  # built on the meta device: no memory needed
    assert counted == formula_num_params(config) == PUBLISHED_PARAMS[size]


def test_formula_by_hand_for_a_tiny_shape():
    config = ModelConfig(d_model=4, d_ff=6, num_layers=2, num_heads=2, vocab_size=10)
    # 2*V*d = 80; per layer 4*16 + 3*4*6 + 2*4 = 144; final norm 4
    assert formula_num_params(config) == 80 + 2 * 144 + 4
    assert count_parameters(TransformerLM(config)) == 372


def test_overrides_and_size_names():
    assert ModelConfig.from_size("XL").size_name == "xl"
    assert ModelConfig.from_size("small", d_model=768).size_name == "small"
    custom = ModelConfig.from_size("small", num_layers=2, vocab_size=50257)
    assert (custom.size_name, custom.num_layers, custom.vocab_size, custom.d_model) == ("custom", 2, 50257, 768)
    assert ModelConfig.from_size("small", rope_theta=500000.0).rope_theta == 500000.0


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (dict(num_heads=5), "divisible"),
        (dict(d_model=30, num_heads=10), "even head dimension"),
        (dict(d_ff=0), "d_ff must be positive"),
        (dict(attention="flash"), "attention"),
    ],
)
def test_invalid_shapes_raise_config_error(changes, message):
    with pytest.raises(ConfigError, match=message):
        tiny_model_config(**changes).validate()


def test_unknown_size():
    with pytest.raises(ConfigError, match="unknown model size 'huge'"):
        ModelConfig.from_size("huge")


def test_forward_shape_and_dtype():
    model = TransformerLM(tiny_model_config())
    logits = model(torch.randint(0, 97, (3, 16)))
    assert logits.shape == (3, 16, 97) and logits.dtype == torch.float32


def test_model_is_causal():
    torch.manual_seed(0)
    model = TransformerLM(tiny_model_config()).eval()
    tokens = torch.randint(0, 97, (1, 16))
    changed = tokens.clone()
    changed[0, 10:] = (changed[0, 10:] + 1) % 97
    with torch.no_grad():
        a, b = model(tokens), model(changed)
    torch.testing.assert_close(a[0, :10], b[0, :10])
    assert not torch.allclose(a[0, 10:], b[0, 10:])


def test_naive_and_sdpa_attention_agree():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 12, 8, dtype=torch.float64) for _ in range(3))
    torch.testing.assert_close(naive_causal_attention(q, k, v), sdpa_causal_attention(q, k, v))


def test_naive_and_sdpa_models_agree():
    torch.manual_seed(0)
    naive = TransformerLM(tiny_model_config(attention="naive"))
    sdpa = TransformerLM(tiny_model_config(attention="sdpa"))
    sdpa.load_state_dict(naive.state_dict())
    tokens = torch.randint(0, 97, (2, 16))
    torch.testing.assert_close(naive(tokens), sdpa(tokens), rtol=1e-4, atol=1e-5)


def test_rmsnorm_runs_in_fp32_under_bf16_autocast():
    model = TransformerLM(tiny_model_config())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(torch.randint(0, 97, (1, 8)))
    assert logits.dtype == torch.bfloat16
    assert model.layers[0].ln1(torch.randn(2, 32, dtype=torch.bfloat16)).dtype == torch.bfloat16


def test_sequence_longer_than_context_rejected():
    model = TransformerLM(tiny_model_config(context_length=8))
    with pytest.raises(ValueError, match="exceeds the model's context length"):
        model(torch.zeros(1, 9, dtype=torch.long))


def test_user_factory_loads_and_receives_shape(fixtures_on_path):
    config = tiny_model_config()
    model = build_model(config, "cpu", "user_models:make_model")
    assert model.embed.num_embeddings == 97 and model.embed.embedding_dim == 32
    check_model_output(model, config, "cpu", "user model")
    assert count_parameters_for(config, "user_models:make_model") == count_parameters(model)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no_colon", "must look like package.module:callable"),
        ("no_such_module_xyz:make", "cannot import 'no_such_module_xyz'"),
        ("broken_import:anything", "cannot import 'broken_import'.*cannot be imported"),
        ("user_models:missing", "has no attribute 'missing'"),
        ("user_models:NOT_CALLABLE", "not callable"),
    ],
)
def test_factory_loading_errors(fixtures_on_path, spec, message):
    with pytest.raises(ModelFactoryError, match=message):
        load_model_factory(spec)


def test_factory_returning_wrong_things(fixtures_on_path):
    config = tiny_model_config()
    with pytest.raises(ModelFactoryError, match="expected a torch.nn.Module"):
        build_model(config, "cpu", "user_models:not_a_module")
    with pytest.raises(ModelFactoryError, match="raised RuntimeError: my model is broken"):
        build_model(config, "cpu", "user_models:raises")
    model = build_model(config, "cpu", "user_models:wrong_shape")
    with pytest.raises(ModelFactoryError, match=r"shape \(2, 97\), expected floating \(B, T, V\) = \(2, 8, 97\)"):
        check_model_output(model, config, "cpu", "wrong")


def test_check_context_is_the_one_context_length_check():
    model = ModelConfig(d_model=32, d_ff=64, num_layers=1, num_heads=2, vocab_size=97, context_length=16)
    model.check_context(16)
    with pytest.raises(ConfigError, match=r"--context-length 17 is longer than the model supports .*16"):
        model.check_context(17)
    with pytest.raises(ConfigError, match="--context-lengths up to 64 is longer"):
        model.check_context(64, "--context-lengths up to 64")
