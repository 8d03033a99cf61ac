"""Traces chatdev-025 ... chatdev-030: the chain as a capable model plays it (clean runs)."""

from chatdev_dsl import Chain, code, examples, python, write
from he_prompts import PROMPTS


def t025():
    c = Chain("chatdev-025", "HumanEval/13", PROMPTS)
    c.phase("design")
    c.say(
        "ceo",
        "The customer needs `greatest_common_divisor(a: int, b: int) -> int`: given two integers, return "
        "their greatest common divisor. The docstring's examples: greatest_common_divisor(3, 5) == 1 and "
        "greatest_common_divisor(25, 15) == 5. It names no other edge cases.",
    )
    c.say(
        "cto",
        "Use Euclid's algorithm: while b is non-zero, replace (a, b) with (b, a % b); when b reaches 0, a is "
        "the GCD. No imports, O(log min(a, b)) steps, and b == 0 gives a directly. <INFO> Finished",
    )
    c.phase("coding")
    c.say(
        "cto",
        "Write greatest_common_divisor to solution.py with Euclid's algorithm exactly as designed: loop "
        "while b, update a, b = b, a % b, return a. Keep the signature from the task.",
    )
    c.say(
        "programmer",
        "Writing the function.",
        write(
            code("""
                def greatest_common_divisor(a: int, b: int) -> int:
                    while b:
                        a, b = b, a % b
                    return a
            """)
        ),
    )
    c.say(
        "programmer",
        "solution.py now holds greatest_common_divisor with Euclid's algorithm (loop while b, then return "
        "a). <INFO> Finished",
    )
    c.phase("code_review")
    c.say(
        "reviewer",
        "Running the docstring examples against solution.py.",
        examples("[exit code 0]\n2 of 2 examples passed\n"),
    )
    c.say(
        "reviewer",
        "Both examples pass (3, 5 -> 1 and 25, 15 -> 5), and the loop always ends because a % b is smaller "
        "than b. Nothing to fix. <INFO> Finished",
    )
    c.check("test_and_fix", "[exit code 0]\n2 of 2 examples passed\n")
    c.check("final", "[exit code 0]\n2 of 2 examples passed\n")
    return c.record(True, "", "clean: designed, written, examples run by the reviewer, accepted")


def t026():
    c = Chain("chatdev-026", "HumanEval/48", PROMPTS)
    c.phase("design")
    c.say(
        "ceo",
        "The function is `is_palindrome(text: str)`: return True when the string reads the same forwards "
        "and backwards, else False. The docstring names the empty string as a palindrome "
        "(is_palindrome('') is True); its other examples: 'aba' and 'aaaaa' are True, 'zbcd' is False.",
    )
    c.say(
        "cto",
        "Compare the string with its reverse: text == text[::-1]. That covers the empty string and single "
        "characters without special cases. <INFO> Finished",
    )
    c.phase("coding")
    c.say(
        "cto",
        "Write is_palindrome to solution.py as `return text == text[::-1]`, keeping the signature, and "
        "check it on '' and 'zbcd' before you hand it over.",
    )
    c.say(
        "programmer",
        "Writing the function.",
        write("def is_palindrome(text: str):\n    return text == text[::-1]\n"),
    )
    c.say(
        "programmer",
        "Checking the cases the CTO named.",
        python(
            "from solution import is_palindrome\nprint(is_palindrome(''), is_palindrome('aba'), "
            "is_palindrome('zbcd'))\n",
            "[exit code 0]\nTrue True False\n",
        ),
    )
    c.say(
        "programmer",
        "is_palindrome is in solution.py: '' -> True, 'aba' -> True, 'zbcd' -> False, as the docstring "
        "says. <INFO> Finished",
    )
    c.phase("code_review")
    c.say("reviewer", "Running the examples.", examples("[exit code 0]\n4 of 4 examples passed\n"))
    c.say("reviewer", "All 4 examples pass; the slice comparison is right for every string. <INFO> Finished")
    c.check("test_and_fix", "[exit code 0]\n4 of 4 examples passed\n")
    c.check("final", "[exit code 0]\n4 of 4 examples passed\n")
    return c.record(True, "", "clean: the programmer checks the edge cases, the reviewer runs the examples")


def t027():
    c = Chain("chatdev-027", "HumanEval/0", PROMPTS)
    c.phase("design")
    c.say(
        "ceo",
        "Function: has_close_elements(numbers: List[float], threshold: float) -> bool. Return True if any "
        "two numbers in the list are closer to each other than the threshold (their distance is strictly "
        "less than it), else False. Examples: [1.0, 2.0, 3.0] with 0.5 -> False; [1.0, 2.8, 3.0, 4.0, 5.0, "
        "2.0] with 0.3 -> True.",
    )
    c.say(
        "cto",
        "Sort a copy of the list; the closest pair is then always adjacent. Scan adjacent pairs and return "
        "True as soon as b - a < threshold, False after the scan. O(n log n), and lists shorter than two "
        "return False without a special case.",
    )
    c.phase("coding")
    c.say(
        "cto",
        "Implement has_close_elements in solution.py: sorted copy, compare each adjacent pair with a strict "
        "< threshold, return True on the first hit and False at the end. Keep the List import.",
    )
    c.say(
        "programmer",
        "Writing it.",
        write(
            code("""
                from typing import List


                def has_close_elements(numbers: List[float], threshold: float) -> bool:
                    ordered = sorted(numbers)
                    for a, b in zip(ordered, ordered[1:]):
                        if b - a < threshold:
                            return True
                    return False
            """)
        ),
    )
    c.say(
        "programmer",
        "has_close_elements is in solution.py: it sorts a copy and compares adjacent pairs with a strict <.",
    )
    c.phase("code_review")
    c.say("reviewer", "Running the docstring examples.", examples("[exit code 0]\n2 of 2 examples passed\n"))
    c.say(
        "reviewer",
        "Both examples pass. Sorting makes the adjacent scan complete, and the comparison is strict as "
        "'closer than' requires. <INFO> Finished",
    )
    c.check("test_and_fix", "[exit code 0]\n2 of 2 examples passed\n")
    c.check("final", "[exit code 0]\n2 of 2 examples passed\n")
    return c.record(True, "", "clean: sort-and-scan design, written as designed, examples pass")


def t028():
    c = Chain("chatdev-028", "HumanEval/12", PROMPTS)
    c.phase("design")
    c.say(
        "ceo",
        "longest(strings: List[str]) -> Optional[str]: return the longest string; when several share the "
        "maximum length return the first of them; return None for an empty list. Examples: longest([]) -> "
        "None, longest(['a', 'b', 'c']) -> 'a', longest(['a', 'bb', 'ccc']) -> 'ccc'.",
    )
    c.say(
        "cto",
        "Use max(strings, key=len): max returns the first of equal maxima, which is exactly the tie rule. "
        "<INFO> Finished",
    )
    c.phase("coding")
    c.say("cto", "Write longest in solution.py with max(strings, key=len). Keep the typing imports.")
    c.say(
        "programmer",
        "Writing it.",
        write(
            code("""
                from typing import List, Optional


                def longest(strings: List[str]) -> Optional[str]:
                    return max(strings, key=len)
            """)
        ),
    )
    c.say(
        "programmer",
        "longest is written with max(strings, key=len), which keeps the first string on ties. "
        "<INFO> Finished",
    )
    c.phase("code_review")
    c.say(
        "reviewer",
        "Running the examples.",
        examples(
            "[exit code 1]\n"
            "**********************************************************************\n"
            'File "examples", line 3, in longest\n'
            "Failed example:\n"
            "    longest([])\n"
            "Exception raised:\n"
            "    Traceback (most recent call last):\n"
            '      File "/usr/lib/python3.11/doctest.py", line 1353, in __run\n'
            '        exec(compile(example.source, filename, "single",\n'
            '      File "<doctest longest[0]>", line 1, in <module>\n'
            "        longest([])\n"
            '      File "solution.py", line 5, in longest\n'
            "        return max(strings, key=len)\n"
            "               ^^^^^^^^^^^^^^^^^^^^^\n"
            "    ValueError: max() arg is an empty sequence\n"
            "2 of 3 examples passed\n"
        ),
    )
    c.say(
        "reviewer",
        "longest([]) raises ValueError: max() arg is an empty sequence, and the docstring wants None for an "
        "empty list. Return None before calling max when the list is empty. The other two examples pass.",
    )
    c.say(
        "programmer",
        "Adding the empty-list branch.",
        write(
            code("""
                from typing import List, Optional


                def longest(strings: List[str]) -> Optional[str]:
                    if not strings:
                        return None
                    return max(strings, key=len)
            """)
        ),
    )
    c.say("programmer", "longest([]) now returns None before max is called.")
    c.say("reviewer", "Re-running the examples.", examples("[exit code 0]\n3 of 3 examples passed\n"))
    c.say("reviewer", "All 3 examples pass now, the empty list included. <INFO> Finished")
    c.check("test_and_fix", "[exit code 0]\n3 of 3 examples passed\n")
    c.check("final", "[exit code 0]\n3 of 3 examples passed\n")
    return c.record(
        True, "", "clean: the review's run finds the empty-list case, the fix is re-run and passes"
    )


def t029():
    c = Chain("chatdev-029", "HumanEval/26", PROMPTS)
    c.phase("design")
    c.say(
        "ceo",
        "remove_duplicates(numbers: List[int]) -> List[int]: remove every element that occurs more than "
        "once (all its copies), and keep the remaining elements in their input order. Example: "
        "[1, 2, 3, 2, 4] -> [1, 3, 4].",
    )
    c.say(
        "cto",
        "Count how often each number occurs, then keep, in input order, the numbers whose count is 1. "
        "collections.Counter does the counting in one pass. <INFO> Finished",
    )
    c.phase("coding")
    c.say(
        "cto",
        "Write remove_duplicates in solution.py: counts = Counter(numbers), return [n for n in numbers if "
        "counts[n] == 1].",
    )
    c.say(
        "programmer",
        "Writing it.",
        write(
            code("""
                from typing import List


                def remove_duplicates(numbers: List[int]) -> List[int]:
                    counts = Counter(numbers)
                    return [n for n in numbers if counts[n] == 1]
            """)
        ),
    )
    c.say(
        "programmer",
        "remove_duplicates counts with Counter and keeps the numbers seen exactly once, in input order. "
        "<INFO> Finished",
    )
    c.phase("code_review")
    c.say(
        "reviewer",
        "Running the example.",
        examples(
            "[exit code 1]\n"
            "**********************************************************************\n"
            'File "examples", line 3, in remove_duplicates\n'
            "Failed example:\n"
            "    remove_duplicates([1, 2, 3, 2, 4])\n"
            "Exception raised:\n"
            "    Traceback (most recent call last):\n"
            '      File "/usr/lib/python3.11/doctest.py", line 1353, in __run\n'
            '        exec(compile(example.source, filename, "single",\n'
            '      File "<doctest remove_duplicates[0]>", line 1, in <module>\n'
            "        remove_duplicates([1, 2, 3, 2, 4])\n"
            '      File "solution.py", line 5, in remove_duplicates\n'
            "        counts = Counter(numbers)\n"
            "                 ^^^^^^^\n"
            "    NameError: name 'Counter' is not defined\n"
            "0 of 1 examples passed\n"
        ),
    )
    c.say(
        "reviewer",
        "The example fails with NameError: name 'Counter' is not defined; solution.py never imports it. Add "
        "`from collections import Counter` at the top.",
    )
    c.say(
        "programmer",
        "Adding the import.",
        write(
            code("""
                from collections import Counter
                from typing import List


                def remove_duplicates(numbers: List[int]) -> List[int]:
                    counts = Counter(numbers)
                    return [n for n in numbers if counts[n] == 1]
            """)
        ),
    )
    c.say("programmer", "Added `from collections import Counter`.")
    c.say("reviewer", "Re-running the example.", examples("[exit code 0]\n1 of 1 examples passed\n"))
    c.say("reviewer", "The example passes: [1, 2, 3, 2, 4] -> [1, 3, 4]. <INFO> Finished")
    c.check("test_and_fix", "[exit code 0]\n1 of 1 examples passed\n")
    c.check("final", "[exit code 0]\n1 of 1 examples passed\n")
    return c.record(True, "", "clean: a missing import is found by the review's run and fixed")


def t030():
    c = Chain("chatdev-030", "HumanEval/31", PROMPTS)
    c.phase("design")
    c.say(
        "ceo",
        "is_prime(n) returns True if n is prime and False otherwise. The docstring's examples include 1, 4 "
        "and 6 (False) and 11, 61, 101 and 13441 (True).",
    )
    c.say(
        "cto",
        "Return False for n < 2; otherwise trial-divide by every i from 2 while i * i <= n, returning False "
        "on a divisor and True after the loop. O(sqrt(n)), fast for 13441.",
    )
    c.phase("coding")
    c.say(
        "cto", "Implement is_prime in solution.py as designed: n < 2 -> False, trial division up to sqrt(n)."
    )
    c.say(
        "programmer",
        "Writing it.",
        write(
            code("""
                def is_prime(n):
                    if n < 2:
                        return False
                    i = 2
                    while i * i <= n:
                        if n % i == 0:
                            return False
                        i += 1
                    return True
            """)
        ),
    )
    c.say(
        "programmer",
        "Listing the primes below 30 as a check.",
        python(
            "from solution import is_prime\nprint([k for k in range(30) if is_prime(k)])\n",
            "[exit code 0]\n[2, 3, 5, 7, 11, 13, 17, 19, 23, 29]\n",
        ),
    )
    c.say(
        "programmer",
        "is_prime is written; the primes below 30 come out as [2, 3, 5, 7, 11, 13, 17, 19, 23, 29]. "
        "<INFO> Finished",
    )
    c.phase("code_review")
    c.say("reviewer", "Running the docstring examples.", examples("[exit code 0]\n7 of 7 examples passed\n"))
    c.say("reviewer", "All 7 examples pass, 1 and 4 included. <INFO> Finished")
    c.check("test_and_fix", "[exit code 0]\n7 of 7 examples passed\n")
    c.check("final", "[exit code 0]\n7 of 7 examples passed\n")
    return c.record(True, "", "clean: trial division, checked by the programmer and by the reviewer's run")


TRACES = [t025, t026, t027, t028, t029, t030]
