"""The contracts every registered task and workflow keeps (`tasks/base.py`'s `Task`, `engine.Protocol`),
checked on every entry of the registries, so a new task or workflow is covered by registering it: its
own test then only needs its hand-worked cases."""
import dataclasses
import pathlib
import pkgutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from marl_jax import credit, protocols, rollout, tasks, text
from workflows_test import compiled_demonstrate, compiled_rewards

B = 64
SYMBOL_TASKS = sorted(name for name, cls in tasks.REGISTRY.items() if not cls.free_text)
# A workflow is checked on arithmetic unless it needs a task of another shape (its `build` says which).
TASK_FOR = {"exchange": "hidden_sum", "orchestrator": "multi_chain", "delegate": "multi_chain",
            "matrix_game": "matrix_game", "contribution": "contribution"}


def test_every_module_of_the_task_and_workflow_packages_registers_one():
  # A module that forgot its `register` would be skipped by every test here, and by `name`.
  for package, interface in ((tasks, "base"), (protocols, "engine")):
    modules = {f"{package.__name__}.{m.name}" for m in pkgutil.iter_modules(package.__path__)}
    assert sorted(cls.__module__ for cls in package.REGISTRY.values()) == sorted(
        modules - {f"{package.__name__}.{interface}"})


def _problems(task, seed=0):
  return task.sample_batch(jax.random.split(jax.random.key(seed), B))


@pytest.mark.parametrize("name", SYMBOL_TASKS)
def test_every_task_keeps_the_task_contract(name):
  task = tasks.make(name)
  problems = _problems(task)
  prompt_BxP, answer_BxA = problems["prompt"], problems["answer"]
  assert prompt_BxP.shape == (B, task.prompt_len) and prompt_BxP.dtype == jnp.int32
  assert answer_BxA.shape == (B, task.answer_len) and answer_BxA.dtype == jnp.int32
  assert bool(jnp.all(prompt_BxP[:, 0] == text.BOS))
  assert sum(length for _, length in task.prompt_segments) == task.prompt_len
  # The answer scores 1; any message scores in [0, 1], and a random one is not always right.
  score = jax.jit(jax.vmap(task.score))
  np.testing.assert_array_equal(score(problems, answer_BxA), 1.0)
  random_BxA = jax.random.randint(jax.random.key(1), answer_BxA.shape, 0, text.VOCAB_SIZE)
  random_scores_B = score(problems, random_BxA)
  assert bool(jnp.all((random_scores_B >= 0) & (random_scores_B <= 1))) and float(random_scores_B.mean()) < 1
  # Demonstrations: the answer at demo_error_rate 0, the task's wrong answer (with demonstrate's
  # second key) at 1, which is not always right.
  keys_B = jax.random.split(jax.random.key(2), B)
  demo = lambda rate: jax.vmap(dataclasses.replace(task, demo_error_rate=rate).demonstrate)(problems, keys_B)
  np.testing.assert_array_equal(demo(0.0), answer_BxA)
  wrong_BxA = jax.vmap(task.wrong_answer)(problems, jax.vmap(lambda k: jax.random.split(k)[1])(keys_B))
  np.testing.assert_array_equal(demo(1.0), wrong_BxA)
  assert float(score(problems, wrong_BxA).mean()) < 1
  # The evaluation set is a function of its seed (a matrix game has one problem: any seed draws it),
  # named by the problem knobs, not the noise.
  jax.tree.map(np.testing.assert_array_equal, task.eval_set(7, 8), task.eval_set(7, 8))
  assert "demo_error_rate" not in task.problem_knobs()


def _workflow(name, rate: float):
  """Workflow `name` on its task, every demonstration noise (`*_rate` knob) at `rate`."""
  task = tasks.make(TASK_FOR.get(name, "arithmetic"), demo_error_rate=rate)
  protocol = protocols.make(name, task, **{k: rate for k in protocols.defaults(name) if k.endswith("_rate")})
  return task, protocol, protocol.layout(task, tuple(range(len(protocol.roles))))


@pytest.mark.parametrize("name", sorted(protocols.REGISTRY))
def test_every_workflow_keeps_the_protocol_contract(name):
  task, protocol, layout = _workflow(name, 0.5)
  R, N, T = len(protocol.roles), len(protocol.turns), layout.length
  assert 1 <= R <= len(text.ROLE_MARKERS)
  problems = _problems(task)
  tokens_BxT = compiled_demonstrate(protocol, task, layout, problems, jax.random.split(jax.random.key(1), B))
  # A demonstration is a transcript on the canvas the sampler writes: the prompt, the layout's headers.
  assert tokens_BxT.shape == (B, T) and tokens_BxT.dtype == jnp.int32
  np.testing.assert_array_equal(tokens_BxT[:, :layout.prompt_len], problems["prompt"])
  header_T = layout.env_T & (layout.turn_T >= 0)
  np.testing.assert_array_equal(tokens_BxT[:, header_T], np.broadcast_to(layout.marker_T[header_T], (B, header_T.sum())))
  scored = compiled_rewards(protocol, task, layout, problems, tokens_BxT)
  assert scored.team_B.shape == (B,) and scored.role_RxB.shape == (R, B)
  for outcome in (scored.team_B, scored.role_RxB):
    assert bool(jnp.all((outcome >= 0) & (outcome <= 1)))
  assert all(value.shape == () for value in scored.metrics.values())
  np.testing.assert_allclose(scored.metrics["accuracy"], scored.team_B.mean(), rtol=1e-6)
  assert 0 < float(scored.team_B.mean()) < 1  # noisy demonstrations: some right, some not
  if scored.aux_KxB is not None:
    assert scored.aux_KxB.shape[1:] == (B,) and protocol.aux_weights(jnp.int32(0)).shape == scored.aux_KxB.shape[:1]
  if scored.turn_NxB is not None:
    assert scored.turn_NxB.shape == (N, B)
  assert protocol.final_answer(layout, tokens_BxT).shape[0] == B
  assert protocol.final_answer(layout, tokens_BxT).shape[1] >= task.answer_len
  # A workflow with judging roles returns their verdicts on each judged answer as levels of a vocabulary
  # of probabilities, the checker's 0/1 verdict on each answer, and the distinct roles that wrote them.
  judgments = scored.judgments
  assert (judgments is None) == (not protocol.judge_roles)
  if judgments is not None:
    J, K = len(protocol.judge_roles), len(judgments.answer_roles)
    assert judgments.level_JxKxB.shape == (J, K, B) and judgments.truth_KxB.shape == (K, B)
    assert len(set(judgments.answer_roles)) == K and not set(judgments.answer_roles) & set(protocol.judge_roles)
    assert scored.aux_KxB is None  # rewards from peers replace the outcome the auxiliary terms are added to
    assert set(protocol.judge_roles) | set(judgments.answer_roles) <= set(range(R))
    assert bool(jnp.all((judgments.level_JxKxB >= 0) & (judgments.level_JxKxB < len(judgments.levels))))
    assert all(0 <= p <= 1 for p in judgments.levels) and set(np.unique(judgments.truth_KxB)) <= {0, 1}
    # Where each judge writes its level as one token: a position its role writes, whose token states the
    # level the protocol reads from it, on answers written in the answer roles' turns.
    readout = protocol.verdict_readout(layout)
    if readout is not None:
      assert readout.position_JxK.shape == (J, K) and readout.levels == judgments.levels
      assert len(set(readout.token_L)) == len(readout.token_L) == len(readout.levels)
      for j, r in enumerate(protocol.judge_roles):
        assert all(layout.author_T[t] == r for t in readout.position_JxK[j])
        level_KxB = jnp.stack([jnp.argmax(tokens_BxT[:, t, None] == jnp.asarray(readout.token_L), -1)
                               for t in readout.position_JxK[j]])
        written_KxB = jnp.stack([jnp.isin(tokens_BxT[:, t], jnp.asarray(readout.token_L)) for t in readout.position_JxK[j]])
        np.testing.assert_array_equal(jnp.where(written_KxB, level_KxB, judgments.level_JxKxB[j]),
                                      judgments.level_JxKxB[j])
      assert [layout.turn_roles[n] for n in readout.answer_turn_K] == list(judgments.answer_roles)


@pytest.mark.parametrize("name", sorted(protocols.REGISTRY))
def test_every_workflows_noise_free_demonstrations_are_right(name):
  task, protocol, layout = _workflow(name, 0.0)
  problems = _problems(task)
  tokens_BxT = compiled_demonstrate(protocol, task, layout, problems, jax.random.split(jax.random.key(1), B))
  np.testing.assert_array_equal(compiled_rewards(protocol, task, layout, problems, tokens_BxT).team_B, 1.0)


@pytest.mark.parametrize("name", sorted(protocols.REGISTRY))
def test_every_workflow_scores_a_transcript_with_an_absent_role(name):
  # A counterfactual without role r writes `<absent>` then EOS in each of r's message slots: the
  # outcomes stay outcomes (finite, in [0, 1]) for every role made absent.
  task, protocol, layout = _workflow(name, 0.5)
  problems = _problems(task)
  tokens_BxT = compiled_demonstrate(protocol, task, layout, problems, jax.random.split(jax.random.key(1), B))
  # The step's own absent canvases (`rollout.rerun_masks`), one coalition per role.
  R = len(protocol.roles)
  _, absent_RxT, absent_msg_RxT = rollout.rerun_masks(
      layout, credit.Reruns(tuple(map(tuple, np.eye(R, dtype=bool))), "absent"))
  for role in range(R):
    absent_BxT = jnp.where(absent_RxT[role], absent_msg_RxT[role], tokens_BxT)
    scored = compiled_rewards(protocol, task, layout, problems, absent_BxT)
    for outcome in (scored.team_B, scored.role_RxB):
      assert bool(jnp.all((outcome >= 0) & (outcome <= 1))), (protocol.roles[role], outcome)


@pytest.mark.parametrize("path, page", [("marl_jax/credit/team.py", "docs/credit.md"),
                                        ("marl_jax/protocols/relay.py", "docs/workflows.md")])
def test_the_docs_show_the_example_files(path, page):
  # The docs include these files whole (relay after its docstring) as the examples to copy; the
  # build reads them from the repository, so what they show is the code.
  root = pathlib.Path(__file__).parent.parent
  assert f"```{{literalinclude}} ../{path}\n" in (root / page).read_text()


@pytest.mark.parametrize("names, settings_of, page", [(credit.REGISTRY, credit.knobs, "docs/credit.md"),
                                                       (protocols.REGISTRY, protocols.defaults, "docs/workflows.md")])
def test_the_docs_list_every_estimators_and_workflows_settings_with_their_defaults(names, settings_of, page):
  text = (pathlib.Path(__file__).parent.parent / page).read_text()
  for name in sorted(names):
    settings = ", ".join(f"`{key}={value}`" for key, value in settings_of(name).items()) or "none"
    assert f"\n| `{name}` | {settings} |\n" in text, name
