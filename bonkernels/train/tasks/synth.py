"""The embedded task: synthesise a short program in the minilang language from examples.

Each problem is a random program of 1 to 3 instructions (see ``minilang``) drawn from a seeded
generator, so the same (seed, split, index) always gives the same problem. The prompt shows
input/output examples; the reward is the fraction of hidden test cases (other inputs) the
completion passes, computed by the project's interpreter. Example prompt and solution:

    prompt   "3:10,5:16,0:1,7:22="        solution "*3+1"
"""

from __future__ import annotations

import random

from .. import minilang
from .problem import Problem

# (operator, smallest digit, largest digit): no identities (+0, *1, /1, %1) and no division by 0
_INSTRUCTIONS = (("+", 1, 9), ("-", 1, 9), ("*", 2, 9), ("/", 2, 9), ("%", 2, 9))


class SynthTask:
    name = "synth"
    stop_texts: tuple[str, ...] = ("=", ",", "\n")
    max_new_tokens = 8  # 3 instructions of 2 characters, eos, and one spare

    def __init__(self, seed: int = 1234, *, depth_weights=(0.25, 0.45, 0.30), input_range=20,
                 shown=4, hidden=8):
        if shown + hidden > input_range:
            raise ValueError("shown + hidden test cases must not exceed input_range")
        self.seed = seed
        self.depth_weights = tuple(depth_weights)
        self.input_range = input_range
        self.shown = shown
        self.hidden = hidden

    def num_problems(self, split: str):
        return None

    def problem(self, split: str, index) -> Problem:
        rng = random.Random(f"bonkernels-synth:{self.seed}:{split}:{index}")
        while True:
            depth = rng.choices(range(1, len(self.depth_weights) + 1), self.depth_weights)[0]
            text = "".join(
                op + str(rng.randint(lo, hi))
                for op, lo, hi in (rng.choice(_INSTRUCTIONS) for _ in range(depth))
            )
            program = minilang.parse(text)
            outputs = {minilang.run(program, x) for x in range(self.input_range)}
            if len(outputs) > 1:  # a constant function is not worth asking for
                break
        xs = rng.sample(range(self.input_range), self.shown + self.hidden)
        cases = [(x, minilang.run(program, x)) for x in xs]
        shown, hidden = cases[: self.shown], cases[self.shown:]
        prompt = ",".join(f"{x}:{y}" for x, y in shown) + "="
        return Problem(key=f"{split}/{index}", prompt=prompt, solution=text,
                       data={"shown": shown, "hidden": hidden})

    def rewards(self, problems, completions) -> list[float]:
        return [minilang.fraction_passed(c.strip(), p.data["hidden"])
                for p, c in zip(problems, completions, strict=True)]

    def close(self):
        pass
