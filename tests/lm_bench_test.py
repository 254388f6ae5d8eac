"""The language-model speed benchmark: its work counts by hand, its flags' refusals, its tiny run
through the CLI (without the peer: torch and transformers are not marl_jax's dependencies)."""
import json

import pytest

from marl_jax.tools import lm_bench as bench

QWEN3 = "tests/fixtures/lm/qwen3"


def test_work_counts_by_hand():
  # The Qwen3 fixture: 2 layers, hidden 64, 4 query heads and 2 key/value heads of 16, MLP 128,
  # 384 words, tied embeddings, float32.
  setup = bench.make_setup(QWEN3, True, batch=1, prompt=2, answer=3, microbatch=1, dtype="float32")
  # A token at context c: 2 x (2 layers x (q and o 2*64*64 + k and v 2*64*32 + MLP 3*64*128) + 2 layers
  # x q.k and att.v 2*c*64) = 147456 + 512 c; the unembedding 2*64*384 = 49152.
  assert bench.needed_flops(setup.lm, range(2), 1) == (147456 + 512) + (147456 + 1024) + 49152
  # Prefill reads the prompt and header (3 positions) for one token's logits; the update reads all 6
  # positions for the 3 message positions' logits, 3x for forward and backward.
  assert bench.row_flops(setup) == {"prefill": 3 * 147456 + 512 * (1 + 2 + 3) + 49152,
                                    "update": 3 * (6 * 147456 + 512 * 21 + 3 * 49152)}
  # Decode reads positions 3 and 4 (the message's first answer - 1): each time every weight at 4 bytes
  # (tied: the embedding is the unembedding) and the keys and values at 2 layers x 2 heads x 16 x 4
  # bytes x 2 of positions 0..3, then 0..4.
  assert bench.decode_bytes(setup, weight_count=1000) == 2 * 4000 + (4 + 5) * 512
  # The step rows: one token at the message's first position (3, after the prompt and header) and at
  # the canvas's last (5), each reading every weight and the keys and values up to its own.
  assert bench.step_positions(setup) == {"step_first": 3, "step_last": 5}
  assert bench.token_bytes(setup, 1000, 5) == 4000 + 6 * 512
  # --rows: the generations each set of rows needs (decode is the whole answer's less the first token's).
  assert [bench.generations(setup, rows, ("first", "whole")) for rows in (
      ("update",), ("prefill",), ("decode",), bench.ROWS)] == [(), ("first",), ("first", "whole"), ("first", "whole")]


@pytest.mark.parametrize("flags, message", [
    (["--checkpoint", QWEN3, "--peer=torch"], "argument --peer: invalid choice: 'torch' (choose from 'transformers')"),
    (["--checkpoint", QWEN3, "--random_weights", "--prompt=100", "--answer=28"],
     "--prompt=100 and --answer=28 make a canvas of 129 positions (with the turn's one-token header), more "
     "than the model's max_position_embeddings=128; allowed: --prompt + --answer <= 127"),
    (["--checkpoint", QWEN3, "--random_weights", "--batch=6", "--microbatch=4"],
     "--microbatch=4 does not divide --batch=6; allowed: its divisors"),
    (["--shapes=qwen3-7b"], "argument --shapes: invalid choice: 'qwen3-7b' (choose from 'qwen3-0.6b')"),
    (["--checkpoint", QWEN3, "--random_weights", "--cache_block=0"], "--cache_block=0; allowed: an integer >= 1"),
], ids=["peer", "length", "microbatch", "shapes", "cache_block"])
def test_a_bad_flag_is_refused_naming_it_and_what_is_allowed(flags, message, capsys):
  with pytest.raises(SystemExit) as exit_info:
    bench.main(flags)
  assert exit_info.value.code in (1, 2)  # argparse's own refusals exit with 2
  assert message in capsys.readouterr().err


def test_named_shapes_are_the_fixture_at_qwen3_0_6b_sizes(tmp_path):
  directory = bench.write_shapes("qwen3-0.6b", str(tmp_path))
  setup = bench.make_setup(directory, True, batch=1, prompt=4, answer=4, microbatch=1, dtype="float32")
  assert (setup.lm.num_hidden_layers, setup.lm.hidden_size, setup.lm.vocab_size) == (28, 1024, 151936)
  # The policy's canvas spans the whole vocabulary, as with Qwen3's own tokenizer (the fixture's alone
  # holds 384 words).
  assert set(setup.exp.model.canvas_ids_V) == set(range(151936))


@pytest.mark.slow
def test_the_tiny_run_prints_every_row(tmp_path, capsys):
  out = tmp_path / "rows.json"
  bench.main([f"--checkpoint={QWEN3}", "--random_weights", "--batch=2", "--prompt=8", "--answer=4", "--microbatch=1",
              "--repeats=1", "--cache_block=4", f"--out={out}", "--rows", *bench.ROWS])
  lines = capsys.readouterr().out.splitlines()
  assert [line.split(" | ")[0] for line in lines if line.startswith("| ") and "---" not in line] == [
      "| row", "| prefill", "| decode", "| update", "| step_first", "| step_last"]
  assert lines[-1].startswith("One token at the canvas's last position costs ")
  written = json.loads(out.read_text())
  rows, header = written["rows"], written["header"]
  assert header["cache_block"] == 4  # the canvas's 13 positions in 4 blocks
  assert [r["row"] for r in rows] == ["prefill", "decode", "update", "step_first", "step_last"]
  assert rows[0]["tokens"] == 2 * (8 + 1) and rows[2]["tokens"] == 2 * (8 + 1 + 4)
  assert 0 < rows[1]["tokens"] <= 2 * 3  # fewer only where a row wrote its end of turn
  # Each row against its bound (its work from the counts above): no timing is asserted.
  setup = bench.make_setup(QWEN3, True, batch=2, prompt=8, answer=4, microbatch=1, dtype="float32")
  assert [r["bound"] for r in rows] == ["flops", "bytes", "flops", "bytes", "bytes"]
  assert [r["work"] for r in rows] == [bench.row_flops(setup)["prefill"], bench.decode_bytes(setup, header["params"]),
                                       bench.row_flops(setup)["update"], bench.token_bytes(setup, header["params"], 9),
                                       bench.token_bytes(setup, header["params"], 12)]
  assert rows[3]["tokens"] == rows[4]["tokens"] == 2
  bounds = [header["matmul_flops_per_s"], header["copy_bytes_per_s"], header["matmul_flops_per_s"],
            header["copy_bytes_per_s"], header["copy_bytes_per_s"]]
  assert all(r["of_bound"] == pytest.approx(r["rate"] / bound) for r, bound in zip(rows, bounds))
