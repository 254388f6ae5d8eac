"""Files a run or a tool writes and reads: replaced in one step (`write_atomically`), and JSON read with
the file named in the error (`read_json`)."""
import json
import os


def write_atomically(path: str, text: str) -> None:
  """Replaces `path` by `text` in one step: a crash leaves the old file or the new one, never a part."""
  tmp = f"{path}.tmp"
  with open(tmp, "w") as f:
    f.write(text)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)


def read_json(path: str) -> dict:
  """A JSON file; one that does not parse is a ValueError naming it."""
  try:
    with open(path) as f:
      return json.load(f)
  except json.JSONDecodeError as e:
    raise ValueError(f"{path} is not valid JSON ({e})") from e
