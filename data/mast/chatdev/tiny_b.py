"""Traces chatdev-007 ... chatdev-012: the chain as a tiny (135M) instruct model plays it."""

from chatdev_dsl import Chain, block, code, examples
from he_prompts import PROMPTS


def t007():
    c = Chain("chatdev-007", "HumanEval/42", PROMPTS)
    opening = (
        "The customer wants a function incr_list that returns a list with elements incremented by 1. For "
        "example incr_list([1, 2, 3]) returns [2, 3, 4]."
    )
    answer = block("def incr_list(l: list):\n    return [x + 1 for x in l]")
    c.phase("design")
    c.say("ceo", opening)
    c.say("cto", "We will loop over the list and add 1 to each element.")
    c.phase("coding")
    c.say("cto", "Write the function incr_list. Add 1 to each element of the list.")
    c.say("programmer", answer)
    c.phase("code_review")
    c.say("reviewer", opening)
    c.say("programmer", answer)
    c.say(
        "reviewer",
        "Great job! I love programming. Programming is fun because you can make games and apps. My "
        "favorite game is Minecraft because you can build houses and castles.",
    )
    c.say(
        "programmer",
        "I love Minecraft too! My favorite thing to build is a big castle with a tower and a garden.",
    )
    c.check("test_and_fix", "[exit code 0]\n2 of 2 examples passed\n")
    c.check("final", "[exit code 0]\n2 of 2 examples passed\n")
    return c.record(
        True,
        "1.3 1.5 2.1 2.3 3.2",
        "the reviewer restarts with the CEO's opening, the code is re-posted, then both chat about games",
    )


def t008():
    c = Chain("chatdev-008", "HumanEval/55", PROMPTS)
    c.phase("design")
    c.say(
        "ceo",
        "The customer wants a function fib that returns the n-th Fibonacci number. For example fib(10) "
        "returns 55, fib(1) returns 1 and fib(8) returns 21.",
    )
    c.say("cto", "We can use recursion. fib(n) is fib(n - 1) + fib(n - 2), and fib(0) is 0 and fib(1) is 1.")
    c.phase("coding")
    c.say("cto", "Please write the function fib with recursion.")
    c.say("programmer", "I will run the examples first.", examples())
    c.say(
        "programmer",
        block(
            code("""
                def fib(n: int):
                    if n <= 1:
                        return n
                    return fib(n - 1) + fib(n - 2)
            """)
        ),
    )
    c.phase("code_review")
    c.say("reviewer", "I will run the examples.", examples("[exit code 0]\n3 of 3 examples passed\n"))
    c.say("reviewer", "All the examples passed. <INFO> Finished")
    c.check("test_and_fix", "[exit code 0]\n3 of 3 examples passed\n")
    c.check("final", "[exit code 0]\n3 of 3 examples passed\n")
    return c.record(
        True, "1.2", "the programmer calls run_examples in coding (refused), then writes a right fib"
    )


def t009():
    c = Chain("chatdev-009", "HumanEval/30", PROMPTS)
    v1 = block("def get_positive(l: list):\n    return [x for x in l if x >= 0]")
    c.phase("design")
    c.say(
        "ceo",
        "The customer wants a function get_positive that returns only the positive numbers in the list. "
        "<INFO> Finished",
    )
    c.phase("coding")
    c.say("cto", "Write the function get_positive. Return the numbers that are positive.")
    c.say("programmer", v1)
    c.phase("code_review")
    c.say(
        "reviewer",
        "Let me run the examples.",
        examples(
            "[exit code 1]\n"
            "**********************************************************************\n"
            'File "examples", line 4, in get_positive\n'
            "Failed example:\n"
            "    get_positive([5, 3, -5, 2, -3, 3, 9, 0, 123, 1, -10])\n"
            "Expected:\n"
            "    [5, 3, 2, 3, 9, 123, 1]\n"
            "Got:\n"
            "    [5, 3, 2, 3, 9, 0, 123, 1]\n"
            "1 of 2 examples passed\n"
        ),
    )
    c.say("reviewer", "The examples failed. Please fix the code.")
    c.say("programmer", v1)
    c.say(
        "reviewer",
        "Let me run the examples.",
        examples(
            "[exit code 1]\n"
            "**********************************************************************\n"
            'File "examples", line 4, in get_positive\n'
            "Failed example:\n"
            "    get_positive([5, 3, -5, 2, -3, 3, 9, 0, 123, 1, -10])\n"
            "Expected:\n"
            "    [5, 3, 2, 3, 9, 123, 1]\n"
            "Got:\n"
            "    [5, 3, 2, 3, 9, 0, 123, 1]\n"
            "1 of 2 examples passed\n"
        ),
    )
    c.say("reviewer", "The examples failed. Please fix the code.")
    c.say("programmer", v1)
    c.check(
        "test_and_fix",
        (
            "[exit code 1]\n"
            "**********************************************************************\n"
            'File "examples", line 4, in get_positive\n'
            "Failed example:\n"
            "    get_positive([5, 3, -5, 2, -3, 3, 9, 0, 123, 1, -10])\n"
            "Expected:\n"
            "    [5, 3, 2, 3, 9, 123, 1]\n"
            "Got:\n"
            "    [5, 3, 2, 3, 9, 0, 123, 1]\n"
            "1 of 2 examples passed\n"
        ),
    )
    c.phase("testing")
    c.say(
        "tester",
        "The example get_positive([5, 3, -5, 2, -3, 3, 9, 0, 123, 1, -10]) returned 0 in the list, but 0 "
        "is not positive. Use x > 0 instead of x >= 0.",
    )
    c.say("programmer", block("def get_positive(l: list):\n    return [x for x in l if x > 0]"))
    c.check("test_and_fix", "[exit code 0]\n2 of 2 examples passed\n")
    c.check("final", "[exit code 0]\n2 of 2 examples passed\n")
    return c.record(
        True,
        "1.3 2.4 2.5",
        "keeps 0; the reviewer sees which example fails but only says 'please fix'; the same code and the "
        "same run come back twice; the tester's precise report fixes it",
    )


def t010():
    c = Chain("chatdev-010", "HumanEval/27", PROMPTS)
    fixed = block("def flip_case(string: str) -> str:\n    return string.swapcase()")
    c.phase("design")
    c.say(
        "ceo",
        "The customer wants a function flip_case. It changes lowercase letters to uppercase and uppercase "
        "letters to lowercase. For example flip_case('Hello') returns 'hELLO'.",
    )
    c.say("cto", "We can use the swapcase method of the string.")
    c.phase("coding")
    c.say("cto", "Please write the function flip_case with swapcase.")
    c.say(
        "programmer",
        "The function flip_case flips the case of the letters. For example, 'Hello' becomes 'hELLO'. This "
        "is useful when you want to change the case of a text.",
    )
    c.phase("code_review")
    c.say("reviewer", f"Here is the code:\n{fixed}\nThe code is correct. <INFO> Finished")
    c.check(
        "test_and_fix",
        (
            "[exit code 1]\n"
            "**********************************************************************\n"
            'File "examples", line 2, in flip_case\n'
            "Failed example:\n"
            "    flip_case('Hello')\n"
            "Expected:\n"
            "    'hELLO'\n"
            "Got nothing\n"
            "0 of 1 examples passed\n"
        ),
    )
    c.phase("testing")
    c.say(
        "tester",
        "The test failed. flip_case('Hello') returned nothing. Please write the code in solution.py.",
    )
    c.say("programmer", fixed)
    c.check("test_and_fix", "[exit code 0]\n1 of 1 examples passed\n")
    c.check("final", "[exit code 0]\n1 of 1 examples passed\n")
    return c.record(
        True,
        "1.2 2.5 3.1 3.2 3.3",
        "asked for swapcase code, the programmer answers in prose; the reviewer writes the code itself and "
        "calls the empty stub correct; the tester gets it written",
    )


def t011():
    c = Chain("chatdev-011", "HumanEval/15", PROMPTS)
    c.phase("design")
    c.say(
        "ceo",
        "The customer wants a function string_sequence that returns the numbers from 0 to n separated by "
        "spaces. For example string_sequence(5) returns '0 1 2 3 4 5'.",
    )
    c.say("cto", "We can use range and join the numbers with spaces.")
    c.phase("coding")
    c.say("cto", "Write the function string_sequence. Use range(n + 1) so that n is included.")
    c.say(
        "programmer",
        "I will use range(n + 1) so that n is included.\n"
        + block("def string_sequence(n: int) -> str:\n    return ' '.join(str(i) for i in range(n))"),
    )
    c.phase("code_review")
    c.say("reviewer", "The code uses range(n + 1), so n is included. The code is correct. <INFO> Finished")
    c.check(
        "test_and_fix",
        (
            "[exit code 1]\n"
            "**********************************************************************\n"
            'File "examples", line 2, in string_sequence\n'
            "Failed example:\n"
            "    string_sequence(0)\n"
            "Expected:\n"
            "    '0'\n"
            "Got:\n"
            "    ''\n"
            "**********************************************************************\n"
            'File "examples", line 4, in string_sequence\n'
            "Failed example:\n"
            "    string_sequence(5)\n"
            "Expected:\n"
            "    '0 1 2 3 4 5'\n"
            "Got:\n"
            "    '0 1 2 3 4'\n"
            "0 of 2 examples passed\n"
        ),
    )
    c.phase("testing")
    c.say(
        "tester",
        "The test failed. string_sequence(0) returned '' but it should return '0'. The range must go up "
        "to n + 1.",
    )
    c.say(
        "programmer",
        "I will use range(n + 1).\n"
        + block("def string_sequence(n: int) -> str:\n    return ' '.join(str(i) for i in range(n + 1))"),
    )
    c.check("test_and_fix", "[exit code 0]\n2 of 2 examples passed\n")
    c.check("final", "[exit code 0]\n2 of 2 examples passed\n")
    return c.record(
        True,
        "2.6 3.1 3.2 3.3",
        "says range(n + 1) but writes range(n); the reviewer repeats the claim unrun; the tester's report "
        "fixes it",
    )


def t012():
    c = Chain("chatdev-012", "HumanEval/60", PROMPTS)
    opening = (
        "The customer wants a function sum_to_n that sums the numbers from 1 to n. For example sum_to_n(5) "
        "returns 15."
    )
    review = "The function factorial returns the factorial of n. The factorial of 5 is 120."
    answer = (
        "Sure! Here is a function that computes the factorial of a number:\n"
        + block(
            code("""
                def factorial(n):
                    if n == 0:
                        return 1
                    return n * factorial(n - 1)
            """)
        )
        + "\nThe factorial of 5 is 120."
    )
    c.phase("design")
    c.say("ceo", opening)
    c.say("cto", opening)
    c.phase("coding")
    c.say("cto", "Please write the code.")
    c.say("programmer", answer)
    c.phase("code_review")
    c.say("reviewer", f"{review} <INFO> Finished")
    c.check(
        "test_and_fix",
        (
            "[exit code 1]\n"
            "**********************************************************************\n"
            'File "examples", line 2, in sum_to_n\n'
            "Failed example:\n"
            "    sum_to_n(30)\n"
            "Expected:\n"
            "    465\n"
            "Got nothing\n"
            "**********************************************************************\n"
            'File "examples", line 4, in sum_to_n\n'
            "Failed example:\n"
            "    sum_to_n(100)\n"
            "Expected:\n"
            "    5050\n"
            "Got nothing\n"
            "**********************************************************************\n"
            'File "examples", line 6, in sum_to_n\n'
            "Failed example:\n"
            "    sum_to_n(5)\n"
            "Expected:\n"
            "    15\n"
            "Got nothing\n"
            "**********************************************************************\n"
            'File "examples", line 8, in sum_to_n\n'
            "Failed example:\n"
            "    sum_to_n(10)\n"
            "Expected:\n"
            "    55\n"
            "Got nothing\n"
            "**********************************************************************\n"
            'File "examples", line 10, in sum_to_n\n'
            "Failed example:\n"
            "    sum_to_n(1)\n"
            "Expected:\n"
            "    1\n"
            "Got nothing\n"
            "0 of 5 examples passed\n"
        ),
    )
    c.phase("testing")
    c.say("tester", review)
    c.say("programmer", answer)
    c.check(
        "test_and_fix",
        (
            "[exit code 1]\n"
            "**********************************************************************\n"
            'File "examples", line 2, in sum_to_n\n'
            "Failed example:\n"
            "    sum_to_n(30)\n"
            "Expected:\n"
            "    465\n"
            "Got nothing\n"
            "**********************************************************************\n"
            'File "examples", line 4, in sum_to_n\n'
            "Failed example:\n"
            "    sum_to_n(100)\n"
            "Expected:\n"
            "    5050\n"
            "Got nothing\n"
            "**********************************************************************\n"
            'File "examples", line 6, in sum_to_n\n'
            "Failed example:\n"
            "    sum_to_n(5)\n"
            "Expected:\n"
            "    15\n"
            "Got nothing\n"
            "**********************************************************************\n"
            'File "examples", line 8, in sum_to_n\n'
            "Failed example:\n"
            "    sum_to_n(10)\n"
            "Expected:\n"
            "    55\n"
            "Got nothing\n"
            "**********************************************************************\n"
            'File "examples", line 10, in sum_to_n\n'
            "Failed example:\n"
            "    sum_to_n(1)\n"
            "Expected:\n"
            "    1\n"
            "Got nothing\n"
            "0 of 5 examples passed\n"
        ),
    )
    c.phase("testing")
    c.say("tester", review)
    c.say("programmer", answer)
    c.check(
        "final",
        (
            "[exit code 1]\n"
            "**********************************************************************\n"
            'File "examples", line 2, in sum_to_n\n'
            "Failed example:\n"
            "    sum_to_n(30)\n"
            "Expected:\n"
            "    465\n"
            "Got nothing\n"
            "**********************************************************************\n"
            'File "examples", line 4, in sum_to_n\n'
            "Failed example:\n"
            "    sum_to_n(100)\n"
            "Expected:\n"
            "    5050\n"
            "Got nothing\n"
            "**********************************************************************\n"
            'File "examples", line 6, in sum_to_n\n'
            "Failed example:\n"
            "    sum_to_n(5)\n"
            "Expected:\n"
            "    15\n"
            "Got nothing\n"
            "**********************************************************************\n"
            'File "examples", line 8, in sum_to_n\n'
            "Failed example:\n"
            "    sum_to_n(10)\n"
            "Expected:\n"
            "    55\n"
            "Got nothing\n"
            "**********************************************************************\n"
            'File "examples", line 10, in sum_to_n\n'
            "Failed example:\n"
            "    sum_to_n(1)\n"
            "Expected:\n"
            "    1\n"
            "Got nothing\n"
            "0 of 5 examples passed\n"
        ),
    )
    return c.record(
        False,
        "1.1 1.3 1.5 2.3 3.1 3.2 3.3",
        "writes factorial instead of sum_to_n; accepted unrun; the tester and programmer copy it through "
        "both cycles",
    )


TRACES = [t007, t008, t009, t010, t011, t012]
