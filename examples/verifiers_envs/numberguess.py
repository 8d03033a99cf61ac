"""A multi-turn verifiers env (verifiers 0.4, ``verifiers.v1``): the env's ``run`` plays the user,
as verifiers' TextArena env does. The model guesses a secret number; after each wrong guess the env
answers "higher" or "lower"; the reward is 1 when a guess hits within the allowed number.

Run it through horizon: ``env.name: verifiers:examples/verifiers_envs/numberguess.py``, with task data
rows like ``{"prompt": "...", "secret": 4, "low": 1, "high": 6, "max_guesses": 3}``.
"""

import re

import verifiers.v1 as vf

SYSTEM_PROMPT = "You are playing a guessing game. Reply with one whole number: your guess."


class GuessData(vf.TaskData):
    secret: int
    low: int = 1
    high: int = 6
    max_guesses: int = 3


class GuessTask(vf.Task[GuessData, vf.State, vf.TaskConfig]):
    @vf.metric
    async def guesses(self, trace: vf.Trace) -> float:
        """How many replies the model gave."""
        return float(trace.num_turns)


class GuessTaskset(vf.Taskset[GuessTask, vf.TasksetConfig]):
    """Rows come from the user (env.tasks_file); ``load`` makes a few for a quick look."""

    def load(self):
        for i, secret in enumerate([2, 5, 3, 6]):
            data = GuessData(
                prompt=f"I am thinking of a whole number from 1 to 6. Guess it. (game {i})",
                system_prompt=SYSTEM_PROMPT,
                secret=secret,
            )
            yield GuessTask(data, self.config.task)


def read_guess(reply: str) -> int | None:
    """The game's parser: the first whole number in the reply, None when there is none."""
    match = re.search(r"-?\d+", reply)
    return int(match.group()) if match else None


class GuessEnvConfig(vf.EnvConfig):
    player: vf.AgentConfig = vf.AgentConfig()


class GuessEnv(vf.Env[GuessEnvConfig]):
    """The game: the player's first reply answers the task's prompt; each later turn is the
    env's feedback to the previous guess."""

    async def run(self, task, agents):
        data = task.data
        won = False
        async with agents.player.interaction(task) as interaction:
            segment = await interaction.turn()
            for guess_number in range(1, data.max_guesses + 1):
                if segment.terminated:
                    break
                guess = read_guess(segment.last_reply)
                if guess == data.secret:
                    won = True
                    break
                if guess_number == data.max_guesses:
                    break
                if guess is None:
                    feedback = (
                        f"That is not a number. Reply with one whole number from {data.low} to {data.high}."
                    )
                else:
                    feedback = (
                        f"{guess} is wrong: the number is {'higher' if guess < data.secret else 'lower'}."
                    )
                segment = await interaction.turn(feedback)
        interaction.trace.record_reward("won", float(won), 1.0)


__all__ = ["GuessEnv", "GuessTaskset"]
