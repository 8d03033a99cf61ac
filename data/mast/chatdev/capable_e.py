"""Traces chatdev-043 ... chatdev-046: the chain as a capable model plays it."""

from chatdev_dsl import Chain, block, code, examples, python, write
from he_prompts import PROMPTS


def t043():
    c = Chain("chatdev-043", "HumanEval/14", PROMPTS)
    body = code("""
        from typing import List


        def all_prefixes(string: str) -> List[str]:
            return [string[:i] for i in range(1, len(string) + 1)]
    """)
    c.phase("design")
    c.say(
        "ceo",
        "all_prefixes(string: str) -> List[str]: return all prefixes of the string, from the shortest to "
        "the longest. Example: 'abc' -> ['a', 'ab', 'abc'].",
    )
    c.say(
        "cto",
        "Here is the whole function, so the programmer only has to paste it:\n"
        f"{block(body)}\n<INFO> Finished",
    )
    c.phase("coding")
    c.say("cto", "Put the function from the design into solution.py unchanged.")
    c.say("programmer", "Writing the CTO's function.", write(body))
    c.say("programmer", "Copied the CTO's function into solution.py. <INFO> Finished")
    c.phase("code_review")
    c.say("reviewer", "Running the example.", examples("[exit code 0]\n1 of 1 examples passed\n"))
    c.say("reviewer", "The example passes, and an empty string gives []. <INFO> Finished")
    c.check("test_and_fix", "[exit code 0]\n1 of 1 examples passed\n")
    c.check("final", "[exit code 0]\n1 of 1 examples passed\n")
    return c.record(
        True, "1.2", "the CTO writes the complete function in the design; the programmer pastes it"
    )


def t044():
    c = Chain("chatdev-044", "HumanEval/25", PROMPTS)
    head = code("""
        from typing import List


        def factorize(n: int) -> List[int]:
            factors = []
            i = 2
            while i * i <= n:
                while n % i == 0:
                    factors.append(i)
                    n //= i
                i += 1
    """)
    c.phase("design")
    c.say(
        "ceo",
        "factorize(n: int) -> List[int]: return the prime factors of n from smallest to largest, each "
        "listed as many times as it appears, so that their product is n. Examples: 8 -> [2, 2, 2], 25 -> "
        "[5, 5], 70 -> [2, 5, 7].",
    )
    c.say(
        "cto",
        "Trial division: for i from 2 while i * i <= n, divide i out of n as often as it goes and record it "
        "each time. <INFO> Finished",
    )
    c.phase("coding")
    c.say("cto", "Write factorize in solution.py with trial division as designed.")
    c.say("programmer", "Writing it.", write(head + "    return factors\n"))
    c.say("programmer", "factorize divides out each i from 2 up while i * i <= n. <INFO> Finished")
    c.phase("code_review")
    c.say(
        "reviewer",
        "Running the examples.",
        examples(
            "[exit code 1]\n"
            "**********************************************************************\n"
            'File "examples", line 8, in factorize\n'
            "Failed example:\n"
            "    factorize(70)\n"
            "Expected:\n"
            "    [2, 5, 7]\n"
            "Got:\n"
            "    [2, 5]\n"
            "2 of 3 examples passed\n"
        ),
    )
    c.say(
        "reviewer",
        "factorize(70) returns [2, 5]; 7 is missing. When the loop stops, n itself can still be a prime "
        "factor: add what is left of n.",
    )
    c.say("programmer", "Adding the leftover.", write(head + "    factors.append(n)\n    return factors\n"))
    c.say("programmer", "What is left of n is appended after the loop.")
    c.say(
        "reviewer",
        "Running the examples again.",
        examples(
            "[exit code 1]\n"
            "**********************************************************************\n"
            'File "examples", line 4, in factorize\n'
            "Failed example:\n"
            "    factorize(8)\n"
            "Expected:\n"
            "    [2, 2, 2]\n"
            "Got:\n"
            "    [2, 2, 2, 1]\n"
            "**********************************************************************\n"
            'File "examples", line 6, in factorize\n'
            "Failed example:\n"
            "    factorize(25)\n"
            "Expected:\n"
            "    [5, 5]\n"
            "Got:\n"
            "    [5, 5, 1]\n"
            "1 of 3 examples passed\n"
        ),
    )
    c.say(
        "reviewer",
        "70 passes now, but factorize(8) gives [2, 2, 2, 1] and factorize(25) gives [5, 5, 1]: when n is "
        "fully divided it is 1, and you append that. Append only when n > 1.",
    )
    c.say(
        "programmer",
        "Guarding the append.",
        write(head + "    if n > 1:\n        factors.append(i)\n    return factors\n"),
    )
    c.say("programmer", "Guarded the append with `if n > 1`.")
    c.check(
        "test_and_fix",
        (
            "[exit code 1]\n"
            "**********************************************************************\n"
            'File "examples", line 8, in factorize\n'
            "Failed example:\n"
            "    factorize(70)\n"
            "Expected:\n"
            "    [2, 5, 7]\n"
            "Got:\n"
            "    [2, 5, 6]\n"
            "2 of 3 examples passed\n"
        ),
    )
    c.phase("testing")
    c.say("tester", "Running the examples first.", examples())
    c.say(
        "tester",
        "Reproducing with run_python instead.",
        python(
            "from solution import factorize\nprint(factorize(70), factorize(30))\n",
            "[exit code 0]\n[2, 5, 6] [2, 3, 4]\n",
        ),
    )
    c.say(
        "tester",
        "factorize(70) returns [2, 5, 6] and factorize(30) returns [2, 3, 4]: after the loop you append i, "
        "the next trial divisor, instead of the remaining n. Append n.",
    )
    c.say(
        "programmer",
        "Appending n.",
        write(head + "    if n > 1:\n        factors.append(n)\n    return factors\n"),
    )
    c.say("programmer", "Checking.", examples("[exit code 0]\n3 of 3 examples passed\n"))
    c.say("programmer", "The leftover n is appended now; all 3 examples pass.")
    c.check("test_and_fix", "[exit code 0]\n3 of 3 examples passed\n")
    c.check("final", "[exit code 0]\n3 of 3 examples passed\n")
    return c.record(
        True,
        "1.2",
        "the tester first calls run_examples, which testing does not give it (refused), then finds the slip "
        "with run_python",
    )


def t045():
    c = Chain("chatdev-045", "HumanEval/18", PROMPTS)
    window = code("""
        def how_many_times(string: str, substring: str) -> int:
            count = 0
            for i in range(len(string) - len(substring)):
                if string[i:i + len(substring)] == substring:
                    count += 1
            return count
    """)
    builtin = "def how_many_times(string: str, substring: str) -> int:\n    return string.count(substring)\n"
    c.phase("design")
    c.say(
        "ceo",
        "how_many_times(string, substring) -> int: how many times the substring can be found in the "
        "string, overlapping occurrences counted. Examples: ('', 'a') -> 0, ('aaa', 'a') -> 3, "
        "('aaaa', 'aa') -> 3.",
    )
    c.say("cto", "Count the occurrences of substring in string, overlapping ones included. <INFO> Finished")
    c.phase("coding")
    c.say("cto", "Write how_many_times in solution.py.")
    c.say("programmer", "Writing it.", write(builtin))
    c.say("programmer", "how_many_times returns string.count(substring). <INFO> Finished")
    c.phase("code_review")
    c.say(
        "reviewer",
        "Running the examples.",
        examples(
            "[exit code 1]\n"
            "**********************************************************************\n"
            'File "examples", line 6, in how_many_times\n'
            "Failed example:\n"
            "    how_many_times('aaaa', 'aa')\n"
            "Expected:\n"
            "    3\n"
            "Got:\n"
            "    2\n"
            "2 of 3 examples passed\n"
        ),
    )
    c.say(
        "reviewer",
        "how_many_times('aaaa', 'aa') returns 2, expected 3: str.count skips overlapping matches. Slide a "
        "window instead: count every i where string[i:i + len(substring)] == substring.",
    )
    c.say("programmer", "Switching to a sliding window.", write(window))
    c.say("programmer", "how_many_times now checks the start positions one by one, so overlaps count.")
    c.say(
        "reviewer",
        "Running the examples again.",
        examples(
            "[exit code 1]\n"
            "**********************************************************************\n"
            'File "examples", line 4, in how_many_times\n'
            "Failed example:\n"
            "    how_many_times('aaa', 'a')\n"
            "Expected:\n"
            "    3\n"
            "Got:\n"
            "    2\n"
            "**********************************************************************\n"
            'File "examples", line 6, in how_many_times\n'
            "Failed example:\n"
            "    how_many_times('aaaa', 'aa')\n"
            "Expected:\n"
            "    3\n"
            "Got:\n"
            "    2\n"
            "1 of 3 examples passed\n"
        ),
    )
    c.say(
        "reviewer",
        "Closer, but the window misses the last start position: range(len(string) - len(substring)) stops "
        "one short, so ('aaa', 'a') gives 2 and ('aaaa', 'aa') gives 2.",
    )
    c.say("programmer", "Simplifying.", write(builtin))
    c.say("programmer", "Fixed the range problem by letting str.count do the counting.")
    c.check(
        "test_and_fix",
        (
            "[exit code 1]\n"
            "**********************************************************************\n"
            'File "examples", line 6, in how_many_times\n'
            "Failed example:\n"
            "    how_many_times('aaaa', 'aa')\n"
            "Expected:\n"
            "    3\n"
            "Got:\n"
            "    2\n"
            "2 of 3 examples passed\n"
        ),
    )
    c.phase("testing")
    c.say(
        "tester",
        "how_many_times('aaaa', 'aa') gives 2 again, expected 3: the last change went back to "
        "string.count, which skips overlapping matches; the review had already shown that. Restore the "
        "sliding window with range(len(string) - len(substring) + 1).",
    )
    c.say(
        "programmer",
        "Restoring the window.",
        write(window.replace("len(substring)):", "len(substring) + 1):")),
    )
    c.say("programmer", "Checking.", examples("[exit code 0]\n3 of 3 examples passed\n"))
    c.say(
        "programmer",
        "The sliding window is back, with the last start position included; all 3 examples pass.",
    )
    c.check("test_and_fix", "[exit code 0]\n3 of 3 examples passed\n")
    c.check("final", "[exit code 0]\n3 of 3 examples passed\n")
    return c.record(
        True,
        "1.4",
        "asked to fix the window's range, the programmer brings back str.count, which the review had shown "
        "misses overlaps; the tester restores the window",
    )


def t046():
    c = Chain("chatdev-046", "HumanEval/39", PROMPTS)
    checker = code("""
        def is_prime(k):
            if k < 2:
                return False
            i = 2
            while i * i <= k:
                if k % i == 0:
                    return False
                i += 1
            return True
    """)
    nested = "def prime_fib(n: int):\n" + "".join(f"    {line}\n" for line in checker.splitlines())
    c.phase("design")
    c.say(
        "ceo",
        "prime_fib(n: int) returns the n-th number that is both a Fibonacci number and prime. Examples: "
        "1 -> 2, 2 -> 3, 3 -> 5, 4 -> 13, 5 -> 89.",
    )
    c.say(
        "cto",
        "Generate the Fibonacci numbers in order, test each for primality by trial division, and return "
        "the n-th prime one. <INFO> Finished",
    )
    c.phase("coding")
    c.say("cto", "Write prime_fib in solution.py as designed, with a primality helper.")
    loop = (
        "    a, b = 0, 1\n    c = 0\n    while True:\n        a, b = b, a + b\n        if is_prime(a):\n"
        "            c += 1\n            if c == n:\n                return a\n"
    )
    c.say("programmer", "Writing it.", write(nested + "\n" + loop))
    c.say("programmer", "prime_fib walks the Fibonacci numbers and counts the prime ones. <INFO> Finished")
    c.phase("code_review")
    c.say("reviewer", "Running the examples.", examples("[exit code 0]\n5 of 5 examples passed\n"))
    c.say(
        "reviewer",
        "All five examples pass. Please rename `c` to `count` and add a comment on the Fibonacci update.",
    )
    renamed = (
        loop.replace("c = 0", "count = 0").replace("c += 1", "count += 1").replace("c == n", "count == n")
    )
    renamed = renamed.replace(
        "        a, b = b, a + b\n", "        a, b = b, a + b  # next Fibonacci number\n"
    )
    c.say("programmer", "Renaming.", write(nested + "\n" + renamed))
    c.say("programmer", "Renamed c to count and commented the update.")
    c.say(
        "reviewer",
        "Next, move is_prime out of prime_fib into a module-level helper `_is_prime` so it can be tested "
        "on its own.",
    )
    c.say(
        "programmer",
        "Moving the helper.",
        write(
            checker.replace("def is_prime", "def _is_prime")
            + "\n\ndef prime_fib(n: int):\n"
            + renamed.replace("is_prime(a)", "_is_prime(a)")
        ),
    )
    c.say("programmer", "is_prime is now the module-level helper _is_prime.")
    c.check("test_and_fix", "[exit code 0]\n5 of 5 examples passed\n")
    c.check("final", "[exit code 0]\n5 of 5 examples passed\n")
    return c.record(
        True,
        "1.5",
        "the examples pass on the first review, but the reviewer keeps asking for cosmetic changes until "
        "the turns run out instead of finishing",
    )


TRACES = [t043, t044, t045, t046]
