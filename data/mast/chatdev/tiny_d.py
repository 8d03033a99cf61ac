"""Traces chatdev-019 ... chatdev-024: the chain as a tiny (135M) instruct model plays it."""

from chatdev_dsl import Chain, block, code, examples, python
from he_prompts import PROMPTS


def t019():
    c = Chain("chatdev-019", "HumanEval/58", PROMPTS)
    right = block("def common(l1: list, l2: list):\n    return sorted(set(l1) & set(l2))")
    c.phase("design")
    c.say(
        "ceo",
        "The customer wants a function common. It returns the sorted unique common elements of two lists.",
    )
    c.say("cto", "We can use sets. The common elements are the intersection of the two sets.")
    c.phase("coding")
    c.say("cto", "Write the function common with sets.")
    c.say("programmer", right)
    c.phase("code_review")
    c.say("reviewer", "Please add a comment to the code.")
    c.say(
        "programmer",
        block(
            code("""
                def common(l1, l2):
                    result = []
                    for x in l1:
                        if x in l2:
                            result.append(x)
                    return result
            """)
        ),
    )
    c.say("reviewer", "Thank you. The code is correct now. <INFO> Finished")
    c.check(
        "test_and_fix",
        (
            "[exit code 1]\n"
            "**********************************************************************\n"
            'File "examples", line 2, in common\n'
            "Failed example:\n"
            "    common([1, 4, 3, 34, 653, 2, 5], [5, 7, 1, 5, 9, 653, 121])\n"
            "Expected:\n"
            "    [1, 5, 653]\n"
            "Got:\n"
            "    [1, 653, 5]\n"
            "**********************************************************************\n"
            'File "examples", line 4, in common\n'
            "Failed example:\n"
            "    common([5, 3, 2, 8], [3, 2])\n"
            "Expected:\n"
            "    [2, 3]\n"
            "Got:\n"
            "    [3, 2]\n"
            "0 of 2 examples passed\n"
        ),
    )
    c.phase("testing")
    c.say("tester", "The test failed. The list is not sorted. Please use sorted.")
    c.say("programmer", right)
    c.check("test_and_fix", "[exit code 0]\n2 of 2 examples passed\n")
    c.check("final", "[exit code 0]\n2 of 2 examples passed\n")
    return c.record(
        True,
        "1.4 2.5 3.1 3.2 3.3",
        "asked for a comment, the programmer drops its right set version for an unsorted loop; approved "
        "unrun; the tester's report restores it",
    )


def t020():
    c = Chain("chatdev-020", "HumanEval/29", PROMPTS)
    body = block(
        "def filter_by_prefix(strings, prefix):\n    return [s for s in strings if s.startswith(prefix)]"
    )
    c.phase("design")
    c.say("ceo", f"Here is the code for the customer:\n{body}\n<INFO> Finished")
    c.phase("coding")
    c.say("cto", "<INFO> Finished")
    c.phase("code_review")
    c.say("reviewer", "The code is correct. <INFO> Finished")
    c.check(
        "test_and_fix",
        (
            "[exit code 1]\n"
            "**********************************************************************\n"
            'File "examples", line 2, in filter_by_prefix\n'
            "Failed example:\n"
            "    filter_by_prefix([], 'a')\n"
            "Expected:\n"
            "    []\n"
            "Got nothing\n"
            "**********************************************************************\n"
            'File "examples", line 4, in filter_by_prefix\n'
            "Failed example:\n"
            "    filter_by_prefix(['abc', 'bcd', 'cde', 'array'], 'a')\n"
            "Expected:\n"
            "    ['abc', 'array']\n"
            "Got nothing\n"
            "0 of 2 examples passed\n"
        ),
    )
    c.phase("testing")
    c.say(
        "tester",
        "The function filter_by_prefix returned nothing. Please write the code for filter_by_prefix.",
    )
    c.say("programmer", body)
    c.check("test_and_fix", "[exit code 0]\n2 of 2 examples passed\n")
    c.check("final", "[exit code 0]\n2 of 2 examples passed\n")
    return c.record(
        True,
        "1.2 3.1 3.2 3.3",
        "the CEO writes the code, the CTO ends coding before the programmer speaks, the reviewer calls the "
        "empty stub correct; the tester gets it written",
    )


def t021():
    c = Chain("chatdev-021", "HumanEval/4", PROMPTS)
    c.phase("design")
    c.say(
        "ceo",
        "The customer wants a function mean_absolute_deviation. It returns the average absolute difference "
        "between each number and the mean of the numbers.",
    )
    c.say("cto", "First we compute the mean. Then we add the absolute differences.")
    c.phase("coding")
    c.say("cto", "Write the function mean_absolute_deviation.")
    c.say(
        "programmer",
        block(
            code("""
                def mean_absolute_deviation(numbers):
                    mean = sum(numbers) / len(numbers)
                    return sum(abs(x - mean) for x in numbers)
            """)
        ),
    )
    c.phase("code_review")
    c.say(
        "reviewer",
        "I will run the examples.",
        examples(
            "[exit code 1]\n"
            "**********************************************************************\n"
            'File "examples", line 6, in mean_absolute_deviation\n'
            "Failed example:\n"
            "    mean_absolute_deviation([1.0, 2.0, 3.0, 4.0])\n"
            "Expected:\n"
            "    1.0\n"
            "Got:\n"
            "    4.0\n"
            "0 of 1 examples passed\n"
        ),
    )
    c.say(
        "reviewer",
        "The example failed. mean_absolute_deviation([1.0, 2.0, 3.0, 4.0]) returned 4.0 but it should "
        "return 1.0. Please divide by the length of the list.",
    )
    c.say("programmer", "Thank you! I am happy to help. Do you have any other questions about Python?")
    c.say("reviewer", "What is your favorite programming language?")
    c.say(
        "programmer",
        "My favorite programming language is Python because it is easy to learn and it has many libraries. "
        "I also like JavaScript for making websites.",
    )
    c.check(
        "test_and_fix",
        (
            "[exit code 1]\n"
            "**********************************************************************\n"
            'File "examples", line 6, in mean_absolute_deviation\n'
            "Failed example:\n"
            "    mean_absolute_deviation([1.0, 2.0, 3.0, 4.0])\n"
            "Expected:\n"
            "    1.0\n"
            "Got:\n"
            "    4.0\n"
            "0 of 1 examples passed\n"
        ),
    )
    c.phase("testing")
    c.say(
        "tester",
        "The example mean_absolute_deviation([1.0, 2.0, 3.0, 4.0]) returned 4.0 but it should return 1.0. "
        "Divide the sum by len(numbers).",
    )
    c.say(
        "programmer",
        "You are right! Here is the fixed code:\n"
        + block(
            code("""
                def mean_absolute_deviation(numbers):
                    mean = sum(numbers) / len(numbers)
                    return sum(abs(x - mean) for x in numbers) / 2
            """)
        ),
    )
    c.check(
        "test_and_fix",
        (
            "[exit code 1]\n"
            "**********************************************************************\n"
            'File "examples", line 6, in mean_absolute_deviation\n'
            "Failed example:\n"
            "    mean_absolute_deviation([1.0, 2.0, 3.0, 4.0])\n"
            "Expected:\n"
            "    1.0\n"
            "Got:\n"
            "    2.0\n"
            "0 of 1 examples passed\n"
        ),
    )
    c.phase("testing")
    c.say(
        "tester",
        "The example mean_absolute_deviation([1.0, 2.0, 3.0, 4.0]) returned 2.0 but it should return 1.0. "
        "Divide the sum by len(numbers), not by 2.",
    )
    c.say(
        "programmer",
        "Thank you for your help! Python is a great language for working with numbers. Do you have any "
        "other questions?",
    )
    c.check(
        "final",
        (
            "[exit code 1]\n"
            "**********************************************************************\n"
            'File "examples", line 6, in mean_absolute_deviation\n'
            "Failed example:\n"
            "    mean_absolute_deviation([1.0, 2.0, 3.0, 4.0])\n"
            "Expected:\n"
            "    1.0\n"
            "Got:\n"
            "    2.0\n"
            "0 of 1 examples passed\n"
        ),
    )
    return c.record(
        False,
        "1.5 2.3 2.5",
        "the reviewer's and the tester's exact fix (divide by the length) are thanked, misapplied (/ 2) or "
        "answered with chat; the examples never pass",
    )


def t022():
    c = Chain("chatdev-022", "HumanEval/11", PROMPTS)
    will = "I will write the function to solution.py."
    failed = "The examples failed. Please write the function string_xor."
    c.phase("design")
    c.say(
        "ceo",
        "The customer wants a function string_xor. It takes two strings of 1s and 0s and returns their XOR "
        "as a string.",
    )
    c.say("cto", "We compare the characters one by one. If they are the same we write 0, else we write 1.")
    c.phase("coding")
    c.say("cto", "Please write the function string_xor to solution.py.")
    c.say("programmer", will, python("print('hello')", "[exit code 0]\nhello\n"))
    c.say("programmer", will, python("print('hello')", "[exit code 0]\nhello\n"))
    c.say("programmer", will)
    c.phase("code_review")
    c.say(
        "reviewer",
        "I will run the examples.",
        examples(
            "[exit code 1]\n"
            "**********************************************************************\n"
            'File "examples", line 3, in string_xor\n'
            "Failed example:\n"
            "    string_xor('010', '110')\n"
            "Expected:\n"
            "    '100'\n"
            "Got nothing\n"
            "0 of 1 examples passed\n"
        ),
    )
    c.say("reviewer", failed)
    c.say("programmer", will)
    c.say("reviewer", failed)
    c.say("programmer", will)
    c.check(
        "test_and_fix",
        (
            "[exit code 1]\n"
            "**********************************************************************\n"
            'File "examples", line 3, in string_xor\n'
            "Failed example:\n"
            "    string_xor('010', '110')\n"
            "Expected:\n"
            "    '100'\n"
            "Got nothing\n"
            "0 of 1 examples passed\n"
        ),
    )
    c.phase("testing")
    c.say("tester", "The function string_xor returned nothing. Please write the code.")
    c.say("programmer", will)
    c.check(
        "test_and_fix",
        (
            "[exit code 1]\n"
            "**********************************************************************\n"
            'File "examples", line 3, in string_xor\n'
            "Failed example:\n"
            "    string_xor('010', '110')\n"
            "Expected:\n"
            "    '100'\n"
            "Got nothing\n"
            "0 of 1 examples passed\n"
        ),
    )
    c.phase("testing")
    c.say("tester", "The function string_xor returned nothing. Please write the code.")
    c.say("programmer", will)
    c.check(
        "final",
        (
            "[exit code 1]\n"
            "**********************************************************************\n"
            'File "examples", line 3, in string_xor\n'
            "Failed example:\n"
            "    string_xor('010', '110')\n"
            "Expected:\n"
            "    '100'\n"
            "Got nothing\n"
            "0 of 1 examples passed\n"
        ),
    )
    return c.record(
        False,
        "1.1 1.3 1.5 2.5 2.6",
        "says it will write the function, runs print('hello') twice instead, and repeats the promise to "
        "every request until the end",
    )


def t023():
    c = Chain("chatdev-023", "HumanEval/35", PROMPTS)
    c.phase("design")
    c.say("ceo", "The customer wants a function max_element that returns the maximum element in the list.")
    c.say("cto", "We loop over the list and keep the biggest number.")
    c.phase("coding")
    c.say("cto", "Write the function max_element. Loop over the list and keep the biggest number.")
    c.say(
        "programmer",
        "The list can be empty. If the list is empty, I will return 0.\n"
        + block(
            code("""
                def max_element(l: list):
                    if len(l) == 0:
                        return 0
                    m = l[0]
                    for e in l:
                        if e > m:
                            m = e
                    return m
            """)
        ),
    )
    c.phase("code_review")
    c.say("reviewer", "I will run the examples.", examples("[exit code 0]\n2 of 2 examples passed\n"))
    c.say("reviewer", "All examples passed. <INFO> Finished")
    c.check("test_and_fix", "[exit code 0]\n2 of 2 examples passed\n")
    c.check("final", "[exit code 0]\n2 of 2 examples passed\n")
    return c.record(
        True, "2.2", "the programmer decides by itself that an empty list gives 0 (the task does not say)"
    )


def t024():
    c = Chain("chatdev-024", "HumanEval/44", PROMPTS)
    v1 = block(
        code("""
            def change_base(x: int, base: int):
                result = ''
                while x > 0:
                    result = str(x % base) + result
                    x = x // base
                return result
        """)
    )
    missing = "The code has not been written yet. Please write the function change_base."
    c.phase("design")
    c.say(
        "ceo",
        "The customer wants a function change_base. It changes the number x to the base and returns the "
        "result as a string. The base is less than 10.",
    )
    c.say("cto", "We divide x by the base again and again and keep the remainders.")
    c.phase("coding")
    c.say("cto", "Please write the function change_base.")
    c.say("programmer", v1)
    c.phase("code_review")
    c.say("reviewer", missing)
    c.say("programmer", v1)
    c.say("reviewer", missing)
    c.say("programmer", v1)
    c.check("test_and_fix", "[exit code 0]\n3 of 3 examples passed\n")
    c.check("final", "[exit code 0]\n3 of 3 examples passed\n")
    return c.record(
        True,
        "1.3 1.4 1.5 2.5 3.2 3.3",
        "right code; the reviewer, running nothing, twice ignores the posted code and says none has been "
        "written; it is posted again each time",
    )


TRACES = [t019, t020, t021, t022, t023, t024]
