"""Range checks of numeric settings, and of settings that name roles.  Each refusal reads
`config.KEY=VALUE; allowed: WHAT` and each test is written as what is allowed, so NaN (every comparison
with it False), infinity and a bool are refused too."""
import math
from collections.abc import Callable


def check(key: str, value, allowed: Callable[[float], bool], description: str) -> None:
  """Refuses `config.KEY` unless it is a finite number, not a bool, that `allowed` accepts."""
  if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
      or not allowed(value)):
    raise ValueError(f"config.{key}={value!r}; allowed: {description}")


def integer(key: str, value, low: int, high: int | None = None, note: str = "") -> None:
  """An integer in low..high (no upper bound without `high`); `note` says why, in parentheses."""
  described = f"an integer >= {low}" if high is None else f"an integer in {low}..{high}"
  check(key, value, lambda v: isinstance(v, int) and v >= low and (high is None or v <= high),
        described + (f" ({note})" if note else ""))


def number(key: str, value, low: float, above: bool = False, below: float | None = None) -> None:
  """A number >= low (> low with `above`), and < below when given."""
  if below is None:
    check(key, value, lambda v: v > low if above else v >= low, f"a number {'>' if above else '>='} {low}")
  else:
    check(key, value, lambda v: (v > low if above else v >= low) and v < below,
          f"a number in {'(' if above else '['}{low}, {below})")


def probability(key: str, value) -> None:
  check(key, value, lambda v: 0 <= v <= 1, "a probability in [0, 1]")


def role_names(key: str, value, roles: tuple[str, ...]) -> list[str]:
  """The roles a comma-separated `config.KEY` names ([] for ''), each a role of the workflow."""
  named = [r.strip() for r in str(value).split(",") if r.strip()]
  unknown = [r for r in named if r not in roles]
  if unknown:
    raise ValueError(f"config.{key}={value!r} names {unknown}; allowed: roles of this workflow "
                     f"{list(roles)}, comma-separated")
  return named
