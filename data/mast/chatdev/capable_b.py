"""Traces chatdev-031 ... chatdev-036: the chain as a capable model plays it."""

from chatdev_dsl import Chain, code, examples, python, write
from he_prompts import PROMPTS

HELPER = code("""
    def is_palindrome(string: str) -> bool:
        return string == string[::-1]
""")


def t031():
    c = Chain("chatdev-031", "HumanEval/10", PROMPTS)
    c.phase("design")
    c.say(
        "ceo",
        "make_palindrome(string: str) -> str must return the shortest palindrome that begins with the given "
        "string. The docstring gives the algorithm: find the longest postfix that is a palindrome, then "
        "append the reverse of the prefix before it. Examples: '' -> '', 'cat' -> 'catac', 'cata' -> "
        "'catac'. The helper is_palindrome is already defined in the file.",
    )
    c.say(
        "cto",
        "Try start indices i = 0, 1, ...: the first i for which string[i:] is a palindrome gives the "
        "longest palindromic postfix, and the answer is built from the part before it as the docstring "
        "says. Keep is_palindrome as given. <INFO> Finished",
    )
    c.phase("coding")
    c.say(
        "cto",
        "Write make_palindrome in solution.py below is_palindrome: loop i from 0, stop at the first "
        "palindromic suffix string[i:], and complete the string from string[:i] as the docstring describes.",
    )
    c.say(
        "programmer",
        "Writing both functions.",
        write(
            HELPER
            + "\n\n"
            + code("""
                def make_palindrome(string: str) -> str:
                    for i in range(len(string)):
                        if is_palindrome(string[i:]):
                            return string + string[:i]
            """)
        ),
    )
    c.say("programmer", "make_palindrome returns at the first i whose suffix string[i:] is a palindrome.")
    c.phase("code_review")
    c.say(
        "reviewer",
        "Running the examples.",
        examples(
            "[exit code 1]\n"
            "**********************************************************************\n"
            'File "examples", line 5, in make_palindrome\n'
            "Failed example:\n"
            "    make_palindrome('')\n"
            "Expected:\n"
            "    ''\n"
            "Got nothing\n"
            "**********************************************************************\n"
            'File "examples", line 7, in make_palindrome\n'
            "Failed example:\n"
            "    make_palindrome('cat')\n"
            "Expected:\n"
            "    'catac'\n"
            "Got:\n"
            "    'catca'\n"
            "1 of 3 examples passed\n"
        ),
    )
    c.say(
        "reviewer",
        "Two examples fail: make_palindrome('') returns None and make_palindrome('cat') gives 'catca' "
        "instead of 'catac'. The most important: the prefix string[:i] must be appended reversed, "
        "string[:i][::-1].",
    )
    c.say(
        "programmer",
        "Reversing the prefix.",
        write(
            HELPER
            + "\n\n"
            + code("""
                def make_palindrome(string: str) -> str:
                    for i in range(len(string)):
                        if is_palindrome(string[i:]):
                            return string + string[:i][::-1]
            """)
        ),
    )
    c.say("programmer", "The prefix is now appended reversed.")
    c.say(
        "reviewer",
        "Running the examples again.",
        examples(
            "[exit code 1]\n"
            "**********************************************************************\n"
            'File "examples", line 5, in make_palindrome\n'
            "Failed example:\n"
            "    make_palindrome('')\n"
            "Expected:\n"
            "    ''\n"
            "Got nothing\n"
            "2 of 3 examples passed\n"
        ),
    )
    c.say(
        "reviewer",
        "'cat' and 'cata' pass now. make_palindrome('') still returns None: for an empty string the loop "
        "never runs and the function falls off its end. Return the string when no suffix was found.",
    )
    c.say(
        "programmer",
        "Adding the fallback.",
        write(
            HELPER
            + "\n\n"
            + code("""
                def make_palindrome(string: str) -> str:
                    for i in range(len(string)):
                        if is_palindrome(string[i:]):
                            return string + string[:i][::-1]
                        return string
            """)
        ),
    )
    c.say("programmer", "Added the `return string` fallback.")
    c.check(
        "test_and_fix",
        (
            "[exit code 1]\n"
            "**********************************************************************\n"
            'File "examples", line 5, in make_palindrome\n'
            "Failed example:\n"
            "    make_palindrome('')\n"
            "Expected:\n"
            "    ''\n"
            "Got nothing\n"
            "**********************************************************************\n"
            'File "examples", line 7, in make_palindrome\n'
            "Failed example:\n"
            "    make_palindrome('cat')\n"
            "Expected:\n"
            "    'catac'\n"
            "Got:\n"
            "    'cat'\n"
            "**********************************************************************\n"
            'File "examples", line 9, in make_palindrome\n'
            "Failed example:\n"
            "    make_palindrome('cata')\n"
            "Expected:\n"
            "    'catac'\n"
            "Got:\n"
            "    'cata'\n"
            "0 of 3 examples passed\n"
        ),
    )
    c.phase("testing")
    c.say(
        "tester",
        "Reproducing the report.",
        python(
            "from solution import make_palindrome\n"
            "print(repr(make_palindrome('')), repr(make_palindrome('cat')))\n",
            "[exit code 0]\nNone 'cat'\n",
        ),
    )
    c.say(
        "tester",
        "make_palindrome('') returns None and make_palindrome('cat') returns 'cat'. The fallback `return "
        "string` is indented inside the for loop, so for 'cat' it returns right after the failed check at "
        "i = 0, and for '' the loop never runs. Dedent it to the function body, after the loop.",
    )
    c.say(
        "programmer",
        "Dedenting the fallback.",
        write(
            HELPER
            + "\n\n"
            + code("""
                def make_palindrome(string: str) -> str:
                    for i in range(len(string)):
                        if is_palindrome(string[i:]):
                            return string + string[:i][::-1]
                    return string
            """)
        ),
    )
    c.say("programmer", "Checking.", examples("[exit code 0]\n3 of 3 examples passed\n"))
    c.say("programmer", "The fallback is after the loop now; all 3 examples pass.")
    c.check("test_and_fix", "[exit code 0]\n3 of 3 examples passed\n")
    c.check("final", "[exit code 0]\n3 of 3 examples passed\n")
    return c.record(
        True,
        "",
        "clean: each review run finds one fault; an indentation slip in the last fix is found and fixed in "
        "the test-and-fix cycle",
    )


def t032():
    c = Chain("chatdev-032", "HumanEval/3", PROMPTS)
    c.phase("design")
    c.say(
        "ceo",
        "below_zero(operations: List[int]) -> bool: the account starts at zero; apply the deposits and "
        "withdrawals in order and return True as soon as the balance falls below zero, otherwise False. "
        "Examples: [1, 2, 3] -> False, [1, 2, -4, 5] -> True.",
    )
    c.say(
        "cto",
        "Keep a running balance; after adding each operation return True if it is below zero; return False "
        "after the loop. <INFO> Finished",
    )
    c.phase("coding")
    c.say("cto", "Write below_zero to solution.py with a running balance as designed; keep the List import.")
    c.say(
        "programmer",
        "Writing it.",
        write(
            code("""
                from typing import List


                def below_zero(operations: List[int]) -> bool:
                    balance = 0
                    for op in operations:
                        balance += op
                        if balance < 0:
                            return True
                    return False
            """)
        ),
    )
    c.say(
        "programmer",
        "below_zero keeps a running balance and returns True the first time it drops below zero. "
        "<INFO> Finished",
    )
    c.phase("code_review")
    c.say("reviewer", "Running the examples.", examples("[exit code 0]\n2 of 2 examples passed\n"))
    c.say(
        "reviewer",
        "Both examples pass; the balance is checked after every operation, so a dip that later recovers "
        "([1, 2, -4, 5]) is caught. <INFO> Finished",
    )
    c.check("test_and_fix", "[exit code 0]\n2 of 2 examples passed\n")
    c.check("final", "[exit code 0]\n2 of 2 examples passed\n")
    return c.record(True, "", "clean: running balance, examples pass on the first review")


def t033():
    c = Chain("chatdev-033", "HumanEval/57", PROMPTS)
    c.phase("design")
    c.say(
        "ceo",
        "monotonic(l: list) returns True if the list's elements are monotonically increasing or "
        "decreasing, else False. Examples: [1, 2, 4, 20] -> True, [1, 20, 4, 10] -> False, [4, 1, 0, -10] "
        "-> True.",
    )
    c.say(
        "cto",
        "The docstring doesn't say whether equal neighbours, as in [1, 2, 2, 3], still count as monotonic. "
        "I'll take the strict reading: every step goes strictly up, or every step strictly down. Compare "
        "adjacent pairs with all(a < b) or all(a > b). <INFO> Finished",
    )
    c.phase("coding")
    c.say(
        "cto",
        "Write monotonic in solution.py: True when all adjacent pairs satisfy a < b, or all satisfy a > b.",
    )
    c.say(
        "programmer",
        "Writing it.",
        write(
            code("""
                def monotonic(l: list):
                    pairs = list(zip(l, l[1:]))
                    return all(a < b for a, b in pairs) or all(a > b for a, b in pairs)
            """)
        ),
    )
    c.say(
        "programmer",
        "monotonic is written: strictly increasing or strictly decreasing over adjacent pairs. "
        "<INFO> Finished",
    )
    c.phase("code_review")
    c.say("reviewer", "Running the examples.", examples("[exit code 0]\n3 of 3 examples passed\n"))
    c.say(
        "reviewer",
        "All 3 examples pass and the adjacent-pair check is right in both directions. <INFO> Finished",
    )
    c.check("test_and_fix", "[exit code 0]\n3 of 3 examples passed\n")
    c.check("final", "[exit code 0]\n3 of 3 examples passed\n")
    return c.record(
        False,
        "2.2 3.3",
        "the CTO notices equal neighbours are unspecified and picks 'strict' without asking; the reviewer "
        "approves; [4, 1, 1, 0] fails the hidden tests",
    )


def t034():
    c = Chain("chatdev-034", "HumanEval/145", PROMPTS)
    c.phase("design")
    c.say(
        "ceo",
        "order_by_points(nums) sorts a list of integers in ascending order of the sum of their digits; "
        "items with the same digit sum keep their original order. Examples: [1, 11, -1, -11, -12] -> "
        "[-1, -11, 1, -12, 11]; [] -> [].",
    )
    c.say(
        "cto",
        "Sort with a key function that computes each number's digit sum; Python's sort is stable, so equal "
        "keys keep their input order. <INFO> Finished",
    )
    c.phase("coding")
    c.say(
        "cto", "Write order_by_points in solution.py: sorted(nums, key=digit_sum) with a helper digit_sum(n)."
    )
    c.say(
        "programmer",
        "Writing it.",
        write(
            code("""
                def order_by_points(nums):
                    def digit_sum(n):
                        return sum(int(d) for d in str(abs(n)))

                    return sorted(nums, key=digit_sum)
            """)
        ),
    )
    c.say(
        "programmer",
        "The docstring doesn't say how a minus sign enters the digit sum, so I take the digits of the "
        "absolute value (-12 -> 1 + 2 = 3). The sort is stable, so ties keep their order. <INFO> Finished",
    )
    c.phase("code_review")
    c.say(
        "reviewer",
        "Running the examples.",
        examples(
            "[exit code 1]\n"
            "**********************************************************************\n"
            'File "examples", line 7, in order_by_points\n'
            "Failed example:\n"
            "    order_by_points([1, 11, -1, -11, -12]) == [-1, -11, 1, -12, 11]\n"
            "Expected nothing\n"
            "Got:\n"
            "    False\n"
            "1 of 2 examples passed\n"
        ),
    )
    c.say(
        "reviewer",
        "order_by_points([1, 11, -1, -11, -12]) == [-1, -11, 1, -12, 11] prints False. That expected order "
        "only works if the sign applies to the first digit: -1 -> -1, -11 -> -1 + 1 = 0, -12 -> -1 + 2 = 1, "
        "while 1 -> 1 and 11 -> 2. Negate the leading digit of a negative number.",
    )
    c.say(
        "programmer",
        "Negating the leading digit.",
        write(
            code("""
                def order_by_points(nums):
                    def digit_sum(n):
                        digits = [int(d) for d in str(abs(n))]
                        if n < 0:
                            digits[0] = -digits[0]
                        return sum(digits)

                    return sorted(nums, key=digit_sum)
            """)
        ),
    )
    c.say("programmer", "digit_sum now negates the leading digit of a negative number (-12 -> -1 + 2 = 1).")
    c.say("reviewer", "Running the examples again.", examples("[exit code 0]\n2 of 2 examples passed\n"))
    c.say("reviewer", "Both examples pass now. <INFO> Finished")
    c.check("test_and_fix", "[exit code 0]\n2 of 2 examples passed\n")
    c.check("final", "[exit code 0]\n2 of 2 examples passed\n")
    return c.record(
        True,
        "2.2",
        "the programmer guesses the digit sum of a negative number (abs) instead of asking; the review's "
        "run shows the example wants a signed first digit",
    )


def t035():
    c = Chain("chatdev-035", "HumanEval/21", PROMPTS)
    c.phase("design")
    c.say(
        "ceo",
        "rescale_to_unit(numbers: List[float]) -> List[float]: given at least two numbers, apply a linear "
        "transform so that the smallest becomes 0 and the largest becomes 1. Example: [1.0, 2.0, 3.0, 4.0, "
        "5.0] -> [0.0, 0.25, 0.5, 0.75, 1.0].",
    )
    c.say("cto", "Compute lo = min and hi = max, and map each x to (x - lo) / (hi - lo). <INFO> Finished")
    c.phase("coding")
    c.say("cto", "Implement rescale_to_unit in solution.py with that formula; keep the List import.")
    c.say(
        "programmer",
        "Writing it.",
        write(
            code("""
                from typing import List


                def rescale_to_unit(numbers: List[float]) -> List[float]:
                    lo, hi = min(numbers), max(numbers)
                    if hi == lo:
                        return [0.0 for _ in numbers]
                    return [(x - lo) / (hi - lo) for x in numbers]
            """)
        ),
    )
    c.say(
        "programmer",
        "Written. One case the task leaves open: when all numbers are equal, hi - lo is 0 and the formula "
        "divides by zero. The docstring doesn't say what to return then, so I return all zeros. "
        "<INFO> Finished",
    )
    c.phase("code_review")
    c.say("reviewer", "Running the example.", examples("[exit code 0]\n1 of 1 examples passed\n"))
    c.say("reviewer", "The example passes and the formula matches the design. <INFO> Finished")
    c.check("test_and_fix", "[exit code 0]\n1 of 1 examples passed\n")
    c.check("final", "[exit code 0]\n1 of 1 examples passed\n")
    return c.record(
        True,
        "2.2",
        "the programmer meets an unspecified case (all numbers equal) and settles it itself instead of "
        "asking",
    )


def t036():
    c = Chain("chatdev-036", "HumanEval/91", PROMPTS)
    c.phase("design")
    c.say(
        "ceo",
        'is_bored(S) counts the boredoms in a string: a boredom is a sentence that starts with the word "I", '
        "and sentences are delimited by '.', '?' or '!'. Examples: \"Hello world\" -> 0; \"The sky is blue. "
        'The sun is shining. I love this weather" -> 1.',
    )
    c.say(
        "cto",
        "Split S on the three delimiters with re.split(r'[.?!]', S), strip each piece, and count the pieces "
        'that start with "I". <INFO> Finished',
    )
    c.phase("coding")
    c.say(
        "cto",
        "Write is_bored in solution.py as designed: re.split on [.?!], strip, count the sentences starting "
        "with I.",
    )
    c.say(
        "programmer",
        "Writing it.",
        write(
            code("""
                import re


                def is_bored(S):
                    sentences = re.split(r'[.?!]', S)
                    return sum(1 for s in sentences if s.strip().startswith('I'))
            """)
        ),
    )
    c.say(
        "programmer",
        "is_bored splits on . ? ! and counts the stripped sentences that start with 'I'. <INFO> Finished",
    )
    c.phase("code_review")
    c.say("reviewer", "Running the examples.", examples("[exit code 0]\n2 of 2 examples passed\n"))
    c.say(
        "reviewer",
        'Both examples pass. The docstring says a boredom starts with the word "I" but doesn\'t say whether '
        'a sentence beginning with "It" or "Is" counts; startswith(\'I\') counts them, and I\'ll take that '
        "as the intended reading. <INFO> Finished",
    )
    c.check("test_and_fix", "[exit code 0]\n2 of 2 examples passed\n")
    c.check("final", "[exit code 0]\n2 of 2 examples passed\n")
    return c.record(
        False,
        "1.1 2.2 3.3",
        "the reviewer reads 'starts with the word I' as any sentence starting with I, calls that an open "
        "point, settles it itself and approves; 'Is the sky blue?' fails the hidden tests",
    )


TRACES = [t031, t032, t033, t034, t035, t036]
