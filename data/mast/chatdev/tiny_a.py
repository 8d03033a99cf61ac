"""Traces chatdev-001 ... chatdev-006: the chain as a tiny (135M) instruct model plays it."""

from chatdev_dsl import Chain, block, code
from he_prompts import PROMPTS


def t001():
    c = Chain("chatdev-001", "HumanEval/23", PROMPTS)
    v1 = code("""
        def strlen(string: str) -> int:
            return len(string)
    """)
    c.phase("design")
    c.say(
        "ceo",
        "The customer wants a function called strlen. The function takes a string and returns the "
        "length of the string. For example, strlen('') returns 0 and strlen('abc') returns 3. "
        "<INFO> Finished",
    )
    c.phase("coding")
    c.say(
        "cto",
        "To write the function strlen, we can use the built-in function len. Here is the code:\n"
        f"{block(v1)}\nThis code returns the length of the string.",
    )
    c.say("programmer", f"Here is the code for the function strlen:\n{block(v1)}")
    c.phase("code_review")
    c.say(
        "reviewer",
        "I will run the examples now. The code looks good. The function strlen returns the length of the "
        "string. <INFO> Finished",
    )
    c.check("test_and_fix", "[exit code 0]\n2 of 2 examples passed\n")
    c.check("final", "[exit code 0]\n2 of 2 examples passed\n")
    return c.record(
        True,
        "1.2 2.6 3.2",
        "the CTO writes the code; the reviewer says it will run the examples, calls nothing and approves",
    )


def t002():
    c = Chain("chatdev-002", "HumanEval/53", PROMPTS)
    c.phase("design")
    c.say(
        "ceo",
        "The customer wants a function add that adds two numbers x and y. For example add(2, 3) returns 5 "
        "and add(5, 7) returns 12.",
    )
    c.say("cto", "The function add takes two numbers x and y and returns x + y.")
    c.phase("coding")
    c.say("cto", "Please write the function add. It takes two numbers x and y and returns x + y.")
    c.say("programmer", "Sure! Here is the code:\n" + block("def add(x: int, y: int):\n    return x + y"))
    c.phase("code_review")
    for role in ("reviewer", "programmer", "reviewer", "programmer"):
        c.say(role, "The code is correct.")
    c.check("test_and_fix", "[exit code 0]\n2 of 2 examples passed\n")
    c.check("final", "[exit code 0]\n2 of 2 examples passed\n")
    return c.record(
        True,
        "1.3 1.5 3.2",
        "right code; review is 'The code is correct.' echoed to the turn cap, nothing run",
    )


def t003():
    c = Chain("chatdev-003", "HumanEval/26", PROMPTS)
    v1 = code("""
        def remove_duplicates(numbers):
            return list(set(numbers))
    """)
    report = (
        "The test failed. The function remove_duplicates should remove all elements that occur more "
        "than once. Keep order of elements left the same as in the input."
    )
    c.phase("design")
    c.say(
        "ceo",
        "The customer wants a function remove_duplicates. It takes a list of integers and removes the "
        "duplicates. The order of the elements should stay the same.",
    )
    c.say("cto", "We can use a set to remove the duplicates. A set only keeps one copy of each number.")
    c.phase("coding")
    c.say("cto", "Write the function remove_duplicates. Use a set to remove the duplicates.")
    c.say("programmer", f"Here is the function:\n{block(v1)}")
    c.phase("code_review")
    c.say(
        "reviewer",
        "The function remove_duplicates uses a set to remove the duplicates. A set only keeps one copy "
        "of each number, so the code is correct. <INFO> Finished",
    )
    c.check(
        "test_and_fix",
        (
            "[exit code 1]\n"
            "**********************************************************************\n"
            'File "examples", line 3, in remove_duplicates\n'
            "Failed example:\n"
            "    remove_duplicates([1, 2, 3, 2, 4])\n"
            "Expected:\n"
            "    [1, 3, 4]\n"
            "Got:\n"
            "    [1, 2, 3, 4]\n"
            "0 of 1 examples passed\n"
        ),
    )
    c.phase("testing")
    c.say("tester", report)
    c.say("programmer", f"Here is the function:\n{block(v1)}")
    c.check(
        "test_and_fix",
        (
            "[exit code 1]\n"
            "**********************************************************************\n"
            'File "examples", line 3, in remove_duplicates\n'
            "Failed example:\n"
            "    remove_duplicates([1, 2, 3, 2, 4])\n"
            "Expected:\n"
            "    [1, 3, 4]\n"
            "Got:\n"
            "    [1, 2, 3, 4]\n"
            "0 of 1 examples passed\n"
        ),
    )
    c.phase("testing")
    c.say("tester", report)
    c.say("programmer", f"Here is the function:\n{block(v1)}")
    c.check(
        "final",
        (
            "[exit code 1]\n"
            "**********************************************************************\n"
            'File "examples", line 3, in remove_duplicates\n'
            "Failed example:\n"
            "    remove_duplicates([1, 2, 3, 2, 4])\n"
            "Expected:\n"
            "    [1, 3, 4]\n"
            "Got:\n"
            "    [1, 2, 3, 4]\n"
            "0 of 1 examples passed\n"
        ),
    )
    return c.record(
        False,
        "1.1 1.3 1.5 2.5 3.1 3.2 3.3",
        "dedupes with a set; the reviewer accepts it unrun; the same code and report repeat through both "
        "cycles",
    )


def t004():
    c = Chain("chatdev-004", "HumanEval/24", PROMPTS)
    answer = "Sure! Here is the function largest_divisor:\n" + block(
        code("""
            def largest_divisor(n: int) -> int:
                for i in range(2, n):
                    if n % i == 0:
                        return i
        """)
    )
    report = "The test failed. largest_divisor(15) returned 3 but it should return 5."
    c.phase("design")
    c.say(
        "ceo",
        "Once upon a time there was a small company that made calculators. One day a customer came to the "
        "company and asked for a function largest_divisor. The customer was very happy with the "
        "calculators, and the company grew bigger and bigger. The workers went to the park every Friday "
        "and played football together.",
    )
    c.say(
        "cto",
        "The company was very happy. The calculators were sold in many countries, and the workers had a "
        "big party at the end of the year with cake and music.",
    )
    c.phase("coding")
    c.say("cto", "Please write the function largest_divisor.")
    c.say("programmer", answer)
    c.phase("code_review")
    c.say(
        "reviewer",
        "The function largest_divisor finds the largest number that divides n. Great job! <INFO> Finished",
    )
    c.check(
        "test_and_fix",
        (
            "[exit code 1]\n"
            "**********************************************************************\n"
            'File "examples", line 2, in largest_divisor\n'
            "Failed example:\n"
            "    largest_divisor(15)\n"
            "Expected:\n"
            "    5\n"
            "Got:\n"
            "    3\n"
            "0 of 1 examples passed\n"
        ),
    )
    c.phase("testing")
    c.say("tester", report)
    c.say("programmer", answer)
    c.check(
        "test_and_fix",
        (
            "[exit code 1]\n"
            "**********************************************************************\n"
            'File "examples", line 2, in largest_divisor\n'
            "Failed example:\n"
            "    largest_divisor(15)\n"
            "Expected:\n"
            "    5\n"
            "Got:\n"
            "    3\n"
            "0 of 1 examples passed\n"
        ),
    )
    c.phase("testing")
    c.say("tester", report)
    c.say("programmer", answer)
    c.check(
        "final",
        (
            "[exit code 1]\n"
            "**********************************************************************\n"
            'File "examples", line 2, in largest_divisor\n'
            "Failed example:\n"
            "    largest_divisor(15)\n"
            "Expected:\n"
            "    5\n"
            "Got:\n"
            "    3\n"
            "0 of 1 examples passed\n"
        ),
    )
    return c.record(
        False,
        "1.3 1.5 2.3 2.5 3.1 3.2 3.3",
        "design is a story about the company; the code returns the smallest divisor and is approved unrun; "
        "the tester's exact report gets the same code back twice",
    )


def t005():
    c = Chain("chatdev-005", "HumanEval/16", PROMPTS)
    prose = (
        "The function count_distinct_characters counts how many distinct characters a string has, "
        "regardless of case."
    )
    ask = "Please write the code for count_distinct_characters in a Python code block."
    c.phase("design")
    c.say(
        "ceo",
        "The customer wants a function count_distinct_characters. It counts how many distinct characters "
        "a string has. <INFO> Finished",
    )
    c.phase("coding")
    c.say("cto", prose)
    c.say("programmer", prose)
    c.phase("code_review")
    for role, text in (("reviewer", ask), ("programmer", prose), ("reviewer", ask), ("programmer", prose)):
        c.say(role, text)
    c.check(
        "test_and_fix",
        (
            "[exit code 1]\n"
            "**********************************************************************\n"
            'File "examples", line 2, in count_distinct_characters\n'
            "Failed example:\n"
            "    count_distinct_characters('xyzXYZ')\n"
            "Expected:\n"
            "    3\n"
            "Got nothing\n"
            "**********************************************************************\n"
            'File "examples", line 4, in count_distinct_characters\n'
            "Failed example:\n"
            "    count_distinct_characters('Jerry')\n"
            "Expected:\n"
            "    4\n"
            "Got nothing\n"
            "0 of 2 examples passed\n"
        ),
    )
    c.phase("testing")
    c.say("tester", "The test report says the function returned nothing. Please write the code.")
    c.say("programmer", prose)
    c.check(
        "test_and_fix",
        (
            "[exit code 1]\n"
            "**********************************************************************\n"
            'File "examples", line 2, in count_distinct_characters\n'
            "Failed example:\n"
            "    count_distinct_characters('xyzXYZ')\n"
            "Expected:\n"
            "    3\n"
            "Got nothing\n"
            "**********************************************************************\n"
            'File "examples", line 4, in count_distinct_characters\n'
            "Failed example:\n"
            "    count_distinct_characters('Jerry')\n"
            "Expected:\n"
            "    4\n"
            "Got nothing\n"
            "0 of 2 examples passed\n"
        ),
    )
    c.phase("testing")
    c.say("tester", "The test report says the function returned nothing. Please write the code.")
    c.say("programmer", prose)
    c.check(
        "final",
        (
            "[exit code 1]\n"
            "**********************************************************************\n"
            'File "examples", line 2, in count_distinct_characters\n'
            "Failed example:\n"
            "    count_distinct_characters('xyzXYZ')\n"
            "Expected:\n"
            "    3\n"
            "Got nothing\n"
            "**********************************************************************\n"
            'File "examples", line 4, in count_distinct_characters\n'
            "Failed example:\n"
            "    count_distinct_characters('Jerry')\n"
            "Expected:\n"
            "    4\n"
            "Got nothing\n"
            "0 of 2 examples passed\n"
        ),
    )
    return c.record(
        False,
        "1.1 1.3 1.5 2.5",
        "no code is ever written: the programmer echoes the CTO's sentence to every request until the end",
    )


def t006():
    c = Chain("chatdev-006", "HumanEval/28", PROMPTS)
    body = code("""
        def concatenate_strings(strings):
            result = ''
            for s in strings:
                result += s
            return result
    """)
    c.phase("design")
    c.say(
        "ceo",
        "The customer wants a function concatenate that takes a list of strings and joins them into one "
        "string. For example concatenate(['a', 'b', 'c']) returns 'abc'.",
    )
    c.say("cto", "We will use a for loop to add the strings together one by one.")
    c.phase("coding")
    c.say("cto", "Please write the function concatenate. Use a for loop to add the strings.")
    c.say("programmer", f"Here is the code:\n{block(body)}")
    c.phase("code_review")
    c.say(
        "reviewer",
        "The function concatenate_strings adds all the strings together with a for loop. The code is "
        "correct. <INFO> Finished",
    )
    c.check(
        "test_and_fix",
        (
            "[exit code 1]\n"
            "**********************************************************************\n"
            'File "examples", line 2, in concatenate\n'
            "Failed example:\n"
            "    concatenate([])\n"
            "Expected:\n"
            "    ''\n"
            "Got nothing\n"
            "**********************************************************************\n"
            'File "examples", line 4, in concatenate\n'
            "Failed example:\n"
            "    concatenate(['a', 'b', 'c'])\n"
            "Expected:\n"
            "    'abc'\n"
            "Got nothing\n"
            "0 of 2 examples passed\n"
        ),
    )
    c.phase("testing")
    c.say(
        "tester",
        "The test failed because the function concatenate returned nothing. The function must be called "
        "concatenate, not concatenate_strings.",
    )
    c.say(
        "programmer",
        "You are right. Here is the code:\n" + block(body.replace("concatenate_strings", "concatenate")),
    )
    c.check("test_and_fix", "[exit code 0]\n2 of 2 examples passed\n")
    c.check("final", "[exit code 0]\n2 of 2 examples passed\n")
    return c.record(
        True,
        "2.5 3.1 3.2 3.3",
        "told to write concatenate, the programmer names it concatenate_strings; the reviewer accepts it "
        "unrun; the tester's report gets it renamed",
    )


TRACES = [t001, t002, t003, t004, t005, t006]
