"""The transformers export: stock Arcee (gelu) and Llama (swiglu) checkpoints with our logits, lm-eval's `hf` model
scoring them as our `lowcomm` model does, and the command line's errors."""

import json
import shutil

import pytest
import torch
from lm_eval.api.instance import Instance
from lm_eval.api.registry import get_model
from transformers import AutoModelForCausalLM, AutoTokenizer

from lowcomm.data import EOS
from lowcomm.eval.evaluate import LowcommLM, load_run, run_lm_eval, task_scores
from lowcomm.eval.tasks import OFFLINE_TASK, load_tasks
from lowcomm.export import export_run, main
from lowcomm.model import ModelConfig, Transformer

FILES = ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]


@pytest.fixture(scope="module")
def gelu_export(run_dir, tmp_path_factory):
    return export_run(run_dir, tmp_path_factory.mktemp("export") / "gelu")


@pytest.fixture(scope="module")
def swiglu_run(run_dir, tmp_path_factory):
    """run_dir's config with a random untied SwiGLU model of 4 heads, rope_theta and norm_eps not the defaults."""
    path = tmp_path_factory.mktemp("swiglu_run")
    shutil.copy(run_dir / "config.yaml", path / "config.yaml")
    torch.manual_seed(1)
    model = Transformer(ModelConfig(vocab_size=512, d_model=64, n_layers=2, n_heads=4, mlp="swiglu", d_hidden=96,
                                    max_context=64, tied_embeddings=False, rope_theta=500_000.0, norm_eps=1e-5))
    torch.save({"model": model.state_dict(), "model_config": model.cfg}, path / "model.pt")
    return path


def max_logit_difference(run, export) -> float:
    ours = load_run(run)[0].eval()
    theirs = AutoModelForCausalLM.from_pretrained(export).eval()
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, ours.cfg.vocab_size, (3, ours.cfg.max_context), generator=generator)
    with torch.no_grad():
        return float((ours(tokens) - theirs(tokens).logits).abs().max())


def test_gelu_model_is_a_stock_arcee_checkpoint_with_our_logits(run_dir, gelu_export):
    config = json.loads((gelu_export / "config.json").read_text())
    assert sorted(p.name for p in gelu_export.iterdir()) == FILES
    assert config["model_type"] == "arcee" and config["hidden_act"] == "gelu" and "auto_map" not in config
    assert config["tie_word_embeddings"] and config["max_position_embeddings"] == 64
    assert max_logit_difference(run_dir, gelu_export) < 1e-5


def test_swiglu_model_is_a_stock_llama_checkpoint_with_our_logits(swiglu_run, tmp_path):
    export = export_run(swiglu_run, tmp_path / "swiglu")
    config = json.loads((export / "config.json").read_text())
    assert config["model_type"] == "llama" and "auto_map" not in config
    assert not config["tie_word_embeddings"] and config["rms_norm_eps"] == 1e-5
    assert config["rope_parameters"]["rope_theta"] == 500_000.0
    assert max_logit_difference(swiglu_run, export) < 1e-5


def test_tokenizer_loads_with_autotokenizer_and_encodes_as_ours(run_dir, gelu_export):
    ours = load_run(run_dir)[1]
    theirs = AutoTokenizer.from_pretrained(gelu_export)
    text = "In the beginning God created the heaven and the earth."
    assert theirs(text).input_ids == ours.encode(text).ids  # no BOS or EOS added
    assert theirs.eos_token == EOS and theirs.eos_token_id == ours.token_to_id(EOS)
    assert theirs.model_max_length == 64


def test_lm_evals_hf_model_scores_the_export_as_the_lowcomm_model(run_dir, gelu_export):
    hf = get_model("hf").create_from_arg_string(f"pretrained={gelu_export},batch_size=8", {"device": "cpu"})
    ours = LowcommLM(run_dir, batch_size=8, device="cpu")
    assert hf.max_length == ours.max_length == 64 and hf.prefix_token_id == ours.prefix_token_id
    args = [("The cat", " sat on the mat"), ("", "empty context"), ("a" * 300, " longer than the window")]
    requests = [Instance(request_type="loglikelihood", doc={}, arguments=a, idx=0) for a in args]
    for (theirs, _), (mine, _) in zip(hf.loglikelihood(requests, disable_tqdm=True),
                                      ours.loglikelihood(requests, disable_tqdm=True)):
        assert theirs == pytest.approx(mine, abs=1e-4)
    manager, loaded, _ = load_tasks([OFFLINE_TASK])
    scores = [task_scores(run_lm_eval(lm, manager, loaded, limit=12))[OFFLINE_TASK] for lm in (hf, ours)]
    assert scores[0] == scores[1] and scores[0]["items"] == 12


def error_of(argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    message = str(exc.value.code)
    assert message.startswith("error: ") and "\n" not in message
    return message


def test_command_line_help_and_one_line_errors(run_dir, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0 and "usage: python -m lowcomm.export [-h] RUN_DIR OUT_DIR" in capsys.readouterr().out
    (tmp_path / "incomplete").mkdir()
    assert "model.pt does not exist: give a finished run directory" in error_of([str(tmp_path / "incomplete"),
                                                                                 str(tmp_path / "out")])
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    assert "taken already exists and is not an empty directory: give a new OUT_DIR or remove" in error_of(
        [str(run_dir), str(tmp_path / "taken")])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["incomplete", "taken"]


def test_a_failed_export_leaves_nothing_behind(run_dir, tmp_path, monkeypatch):
    def fail(*args):
        raise RuntimeError("disk full")

    monkeypatch.setattr("lowcomm.export.hf_tokenizer", fail)
    with pytest.raises(RuntimeError):
        export_run(run_dir, tmp_path / "out")
    assert list(tmp_path.iterdir()) == []


def test_command_line_writes_into_an_empty_directory(run_dir, tmp_path, capsys):
    (tmp_path / "out").mkdir()
    main([str(run_dir / "model.pt"), str(tmp_path / "out")])
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == FILES
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # the temporary directory is gone
    assert capsys.readouterr().out.startswith(f"wrote {tmp_path / 'out'}")
