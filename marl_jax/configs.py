"""The config every experiment starts from, and the `:key=value,...` argument parser."""
import importlib.util
import json
import os

import ml_collections

from marl_jax import credit, protocols, rewards, tasks


def parse_arg(arg: str | None, **defaults) -> ml_collections.ConfigDict:
  """'size=cpu,credit=team' -> ConfigDict, checked against the allowed keys in `defaults`; a value
  takes its default's type (an int, a float, or a bool written 'true' / 'false')."""
  out = dict(defaults)
  for item in filter(None, (arg or "").split(",")):
    key, _, value = item.partition("=")
    if key not in defaults:
      raise ValueError(f"config argument {key!r} is unknown; allowed: {sorted(defaults)}")
    out[key] = _typed(key, value, defaults[key])
  return ml_collections.ConfigDict(out)


def _typed(key: str, value: str, default):
  if isinstance(default, bool):
    return check_choice(key, value, ("false", "true")) == "true"
  try:
    return type(default)(value)
  except ValueError:
    raise ValueError(f"config argument {key}={value!r} must be {type(default).__name__}") from None


def sibling(config_file: str, name: str):
  """Another experiment file in the same folder, so one config can build on another."""
  path = os.path.join(os.path.dirname(os.path.abspath(config_file)), f"{name}.py")
  spec = importlib.util.spec_from_file_location(f"experiments.{name}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def check_choice(name: str, value: str, allowed) -> str:
  if value not in allowed:
    raise ValueError(f"config argument {name}={value!r} is unknown; allowed: {list(allowed)}")
  return value


WORKFLOW_TASKS = ("arithmetic", "subset_sum", "stack_program")


def workflow_config(config_file: str, args: ml_collections.ConfigDict, protocol: str, sharing: dict,
                    **knobs) -> ml_collections.ConfigDict:
  """A workflow experiment (experiments/vote.py, best_of_n.py, debate.py): the task suite's config of
  `args.task` (experiments/tasks.py, beside `config_file`) on `protocol` with `knobs`, the estimator
  `args.credit`, the role map `sharing[args.sharing]`, the results scale at size=cpu (10 vmapped
  seeds, 300 steps) and a model long enough for the canvas."""
  check_choice("task", args.task, WORKFLOW_TASKS)
  check_choice("sharing", args.sharing, sharing)
  c = sibling(config_file, "tasks").get_config(
      f"task={args.task},size={args.size},protocol={protocol},credit={args.credit}")
  c.protocol.update(knobs)
  c.roles.sharing = sharing[args.sharing]
  if args.size == "cpu":
    c.num_seeds, c.total_steps, c.eval_every, c.checkpoint_every = 10, 300, 50, 300
  fit_canvas(c)
  return c


def fit_canvas(c: ml_collections.ConfigDict) -> None:
  """Raises `config.model.max_len` to the canvas of the config's task and protocol (the prompt and
  every turn), so a protocol with more turns (voters, rounds) fits the model's positions."""
  task = tasks.from_config(c)
  protocol = protocols.make(c.protocol.name, task, **{k: v for k, v in c.protocol.items() if k != "name"})
  c.model.max_len = max(c.model.max_len, protocol.layout(task, (0,) * len(protocol.roles)).length)


# The config groups whose `name` (`pay` for the reward) picks a registered task, protocol, credit
# estimator or judges' payment rule, the other keys being its settings: each one's settings and their
# defaults.
NAMED_GROUPS = {"task": tasks.knobs, "protocol": protocols.knobs, "credit": credit.knobs,
                "reward": rewards.knobs}
SELECTOR = {"reward": "pay"}  # the key that names the group's entry, where it is not `name`


def selector(key: str) -> str:
  return SELECTOR.get(key, "name")


def named_group(key: str, name: str, like=None) -> ml_collections.ConfigDict:
  """`config.KEY` (a `NAMED_GROUPS` key) for `name`: its name and every setting at its default, so each
  can be set from the command line (`--config.credit.samples=4`); with `like` (the group of another
  name, or a dict), the settings of `name` that `like` has take its values (an experiment's baseline,
  say)."""
  knobs = NAMED_GROUPS[key](name)
  knobs.update({k: like[k] for k in knobs if like is not None and k in like})
  return ml_collections.ConfigDict({selector(key): name, **knobs})


def credit_config(name: str) -> ml_collections.ConfigDict:
  return named_group("credit", name)


def reward_config(pay: str, **settings) -> ml_collections.ConfigDict:
  """`config.reward` for payment rule `pay`, its settings at their defaults but for `settings`."""
  return named_group("reward", pay, like=settings)


def base_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.num_seeds = 1  # independent runs vmapped in one program
  # Seeds computed at once: vmapped in groups of this many, the groups in sequence (lax.map); 0: all
  # at once.  On a CPU one at a time is faster (a smaller working set); runs agree to float rounding.
  c.seeds_at_once = 0
  c.total_steps = 200
  c.steps_per_call = 10  # steps per compiled call (lax.scan)
  c.log_every = 10
  c.eval_every = 50
  c.checkpoint_every = 100
  c.init_from = ""  # a workdir whose latest checkpoint gives the starting parameters
  # Newcomers joining the team of init_from: roles (comma-separated names) whose parameters are replaced,
  # by fresh ones (source 'fresh') or by another team's (source: its workdir); distil: the warm start
  # (config.sft) trains them alone first (`marl_jax.newcomers`).
  c.newcomers = ml_collections.ConfigDict(dict(roles="", source="fresh", distil=False))
  c.num_devices = 0  # 0: every visible device
  # Devices each parameter set is split over (a `model` mesh axis; the batch is split over the rest):
  # for language models too large for one device, by config.model.sharding_rules (docs/devices.md).
  c.model_shards = 1
  c.distributed = False  # call jax.distributed.initialize() first (multi-host)

  # checkpoint: a local Hugging Face-format Qwen3/Llama directory to use instead of the built-in model
  # (docs/language_models.md); random_weights: its shapes, randomly initialised.
  # lora: train low-rank adapters on the checkpoint's frozen weights instead of the weights themselves.
  # remat: recompute each layer's activations in the backward pass instead of keeping them (less
  # memory per row of an update pass, about a third more compute; results unchanged).
  c.model = ml_collections.ConfigDict(dict(
      d_model=64, n_layers=2, n_heads=4, d_ff=256, max_len=32, dtype="auto", checkpoint="",
      random_weights=False, remat=False, lora=dict(enabled=False, rank=8, alpha=16.0,
                                      targets="q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj")))
  c.task = ml_collections.ConfigDict(dict(name="arithmetic", num_ops=2, max_operand=9, modulus=10,
                                          demo_error_rate=0.6))
  c.protocol = ml_collections.ConfigDict(dict(name="single"))
  # Mixed teams: other model configs by name (`add_model`), each with config.model's keys.
  c.models = ml_collections.ConfigDict()
  # sharing: 'isolated', 'shared' or one set per role ('0,0,1'); trainable: '' (all) or '1,0';
  # models: '' (config.model for every set) or one model per set, 'model' or a config.models name;
  # lr_scale: '' (1 for every set) or one factor per set on config.optim's learning rate ('1,0.1').
  c.roles = ml_collections.ConfigDict(dict(sharing="isolated", trainable="", models="", lr_scale=""))
  # algorithm: a registered loss (marl_jax/losses.py); G = group_size samples of each problem;
  # on_nonfinite: 'skip' or 'stop' at a non-finite reward, advantage, loss, gradient or updated state
  # (docs/reliability.md).
  # microbatch_size: at most this many rows per forward/backward pass on each device, their gradients
  # summed over the minibatch before the optimiser step (0: the whole minibatch in one pass);
  # rollout_batch_size: at most this many rows sampled at once on each device (0: all of them);
  # entropy_roles: the roles the entropy bonus (entropy_coef) applies to, comma-separated ('': all).
  c.rl = ml_collections.ConfigDict(dict(
      algorithm="ppo", batch_size=256, group_size=8, temperature=1.0, epochs=1, minibatches=2,
      microbatch_size=0, rollout_batch_size=0, clip_eps=0.2, kl_coef=0.0, entropy_coef=0.0, entropy_roles="",
      on_nonfinite="skip"))
  # name: a registered estimator (marl_jax/credit/); the other keys are its settings.
  c.credit = credit_config("team")
  # Where the judged roles' reward comes from (source: checker | peer) and how judges are paid (pay: a
  # registered rule, marl_jax/rewards/; the other keys are its settings): docs/peer_review.md.
  c.reward = reward_config("team")
  c.optim = ml_collections.ConfigDict(dict(
      name="adam", learning_rate=3e-4, schedule="constant", warmup_steps=0, max_grad_norm=1.0,
      weight_decay=0.0, b1=0.9, b2=0.99))
  # The warm start's optimiser is config.optim with these keys replacing its own (warmup_steps 0: a
  # tenth of the steps, at most 100).  steps_per_call: steps per compiled call; a signal stops the
  # warm start between two calls (about 2 s each at the quickstart's size on 2 CPU cores), and a rerun
  # resumes it.
  # transcripts: a transcript archive (DIR/marl_transcripts/NAME) to distil instead of the workflow's
  # demonstrations, each role its own messages, from the transcripts `filter` keeps: right | all |
  # credit (weighted by each role's positive difference credit) (`marl_jax.sft`, docs/generations.md);
  # archive_share: the share of each batch drawn from them, the rest the workflow's demonstrations (a replay).
  # microbatch_size: at most this many rows per forward/backward pass, their gradients summed (0: the
  # whole batch in one pass).
  c.sft = ml_collections.ConfigDict(dict(steps=600, batch_size=128, learning_rate=1e-3,
                                         schedule="cosine", warmup_steps=0, b2=0.999, steps_per_call=50,
                                         transcripts="", filter="right", archive_share=1.0, microbatch_size=0))
  # data_dir: read the fixed evaluation set as a versioned TFDS dataset there (built if missing).
  # batch_size: at most this many evaluation rows per pass through the model on each device, the
  # passes in sequence (0: the device's whole share at once).
  # divergence_every: the role-collapse diagnostic `eval_ROLE/next_token_js` (a teacher-forced pass of
  # every parameter set, about twice an evaluation's time) at every k-th evaluation: the steps that are
  # multiples of k * eval_every, and the last (0: never).
  c.eval = ml_collections.ConfigDict(dict(size=512, seed=1234, data_dir="", batch_size=0, divergence_every=2))
  return c


# Groups whose keys follow a name in them (a task's, a protocol's or an estimator's settings, a mixed
# team's models): a saved run's are its own, never filled from another name's defaults.
_NAMED_GROUPS = ("task", "protocol", "credit", "reward", "models")


def read_saved(workdir: str) -> dict:
  """A run's config.json as written.  ValueError naming the file when it is missing or not a JSON
  object."""
  path = os.path.join(workdir, "config.json")
  if not os.path.isfile(path):
    raise ValueError(f"{path} is not there; allowed: the workdir of a run (it writes config.json first)")
  try:
    with open(path, "rb") as f:
      saved = json.load(f)
  except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
    detail = f"{e.msg} at line {e.lineno} column {e.colno}" if isinstance(e, json.JSONDecodeError) else str(e)
    raise ValueError(f"{path} is not JSON ({detail}); allowed: the config a run wrote there") from None
  if isinstance(saved, dict):
    return saved
  raise ValueError(f"{path} is not a JSON object; allowed: the config a run wrote there")


def read_run_config(workdir: str) -> ml_collections.ConfigDict:
  """A run's config.json, `with_new_defaults`, for the commands that read a finished run (`archive`,
  `tools.lm_export`).  ValueError naming the file when it is not a JSON object."""
  return with_new_defaults(ml_collections.ConfigDict(read_saved(workdir)))


def with_new_defaults(saved: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """A run's saved config (its config.json) with each setting `base_config` has gained since it was
  written added at its default, which behaves as the run did (`rl.microbatch_size`, `seeds_at_once`
  0), and each setting since refused where it did nothing rewritten as it behaved, so that an older
  run's workdir still builds its experiment (`python -m marl_jax.tools.archive`, `marl_jax.tools.lm_export`) and
  resumes."""
  def fill(into, defaults, top):
    for key, value in defaults.items():
      if key not in into:
        into[key] = value
      elif isinstance(value, ml_collections.ConfigDict) and not (top and key in _NAMED_GROUPS):
        fill(into[key], value, False)

  fill(saved, base_config(), True)
  # experiments/lm_word_problems.py wrote chat_roles "agent:assistant" for every workflow until the
  # task refused pairs naming roles the workflow lacks; outside `single` it named none and did nothing.
  if (saved.task.get("name") == "word_problems" and saved.protocol.get("name") != "single"
      and saved.task.get("chat_roles") == "agent:assistant"):
    saved.task.chat_roles = ""
  # signalling's sender wrote any symbol until task.vocab (default 4 letters) narrowed its alphabet.
  if saved.task.get("name") == "signalling" and "vocab" not in saved.task:
    saved.task.vocab = 0
  return saved


def add_model(c: ml_collections.ConfigDict, name: str, **overrides) -> ml_collections.ConfigDict:
  """`config.models.NAME`: a copy of `config.model` with `overrides` (e.g. a larger verifier), for
  `config.roles.models`; each of its keys can then be set as `--config.models.NAME.KEY`."""
  c.models[name] = ml_collections.ConfigDict({**c.model.to_dict(), **overrides})
  return c.models[name]


def doubled(model: ml_collections.ConfigDict) -> dict:
  """Settings of a model twice as wide and deep as `model` (about 7x its parameters): the mixed team's
  verifier, and the single agent at that verifier's size."""
  return dict(d_model=2 * model.d_model, n_layers=2 * model.n_layers, d_ff=2 * model.d_ff)


# Keys of a learning scenario's run config that the credit benchmark sets itself, from config.seed,
# config.learning and config.estimators (`tools.credit_benchmark.learning_config`): experiments/credit_benchmark.py
# leaves them out of `config.runs`, so that --config.runs.SCENARIO.KEY for one of them is refused as
# unknown instead of ignored.
BENCHMARK_SETS = ("seed", "num_seeds", "total_steps", "eval_every", "checkpoint_every", "steps_per_call",
                  "log_every", "credit", "init_from")

SIZES = ("tiny", "cpu", "gpu")


def apply_size(c: ml_collections.ConfigDict, size: str) -> ml_collections.ConfigDict:
  """`cpu` keeps the base config; `tiny` shrinks everything to seconds (the tests' variant); `gpu`
  grows the model and batch for an accelerator."""
  check_choice("size", size, SIZES)
  if size == "gpu":
    c.model.update(d_model=256, n_layers=4, n_heads=8, d_ff=1024)
    c.rl.update(batch_size=2048, minibatches=4)
    c.sft.update(steps=3000, batch_size=512)
    c.total_steps, c.eval_every, c.checkpoint_every = 2000, 100, 500
  elif size == "tiny":
    c.model.update(d_model=32, n_layers=1, n_heads=2, d_ff=64)
    c.rl.update(batch_size=32, group_size=4, minibatches=1)
    c.sft.update(steps=20, batch_size=32)
    c.eval.size = 64
    c.total_steps, c.steps_per_call, c.log_every, c.eval_every, c.checkpoint_every = 4, 2, 2, 2, 2
  return c
