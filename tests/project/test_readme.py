"""The README's front page runs as written: its Python example generates tokens, and its test
command is the one CI runs, so neither can rot unseen."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def test_the_python_example_generates_token_ids_for_each_prompt(capsys):
    blocks = re.findall(r"^```python\n(.*?)^```", README, re.S | re.M)
    assert len(blocks) == 1, "the README shows one Python example; this test runs it"
    namespace: dict = {}
    exec(compile(blocks[0], "README.md", "exec"), namespace)
    prompts, outputs = namespace["prompts"], namespace["outputs"]
    # ignore_eos: every prompt runs to the example's max_tokens
    max_tokens = int(re.search(r"max_tokens=(\d+)", blocks[0]).group(1))
    assert len(outputs) == len(prompts)
    for tokens in outputs:
        assert len(tokens) == max_tokens
        assert all(isinstance(t, int) and 0 <= t < 151_936 for t in tokens)
    assert str(outputs) in capsys.readouterr().out  # the example prints what it promises


def test_the_quick_start_test_command_is_what_ci_runs():
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    command = next(line for line in ci if "pytest" in line)
    assert f"\n{command}\n" in README
