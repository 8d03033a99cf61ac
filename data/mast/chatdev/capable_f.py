"""Traces chatdev-047 ... chatdev-049: the chain as a capable model plays it."""

from chatdev_dsl import Chain, code, examples, write
from he_prompts import PROMPTS


def t047():
    c = Chain("chatdev-047", "HumanEval/43", PROMPTS)
    k_sum = code("""
        def k_sum(l, k, target=0):
            if k == 0:
                return target == 0
            if len(l) < k:
                return False
            first, rest = l[0], l[1:]
            return k_sum(rest, k - 1, target - first) or k_sum(rest, k, target)


        def pairs_sum_to_zero(l):
            return k_sum(list(l), 2)
    """)
    c.phase("design")
    c.say(
        "ceo",
        "pairs_sum_to_zero(l) returns True if two distinct elements of the list sum to zero, else False. "
        "Examples: [1, 3, 5, 0] -> False, [1, 3, -2, 1] -> False, [1, 2, 3, 7] -> False, [2, 4, -5, 3, 5, "
        "7] -> True, [1] -> False.",
    )
    c.say(
        "cto",
        "One pass with a set of the values seen so far: for each x, return True if -x was seen, then add x. "
        "<INFO> Finished",
    )
    c.phase("coding")
    c.say("cto", "Write pairs_sum_to_zero in solution.py with the seen-set pass.")
    c.say(
        "programmer",
        "Writing it.",
        write(
            code("""
                def pairs_sum_to_zero(l):
                    seen = set()
                    for x in l:
                        if -x in seen:
                            return True
                        seen.add(x)
                    return False
            """)
        ),
    )
    c.say("programmer", "pairs_sum_to_zero is in solution.py: one pass with a set. <INFO> Finished")
    c.phase("code_review")
    c.say("reviewer", "Running the examples.", examples("[exit code 0]\n5 of 5 examples passed\n"))
    c.say(
        "reviewer",
        "All five pass. Since the analytics team will want triples and quadruples as well, generalise it: "
        "write k_sum(l, k, target=0), which says whether k distinct elements sum to target, and make "
        "pairs_sum_to_zero call k_sum(l, 2).",
    )
    c.say("programmer", "Generalising.", write(k_sum))
    c.say(
        "programmer",
        "Added k_sum (recursive: use the first element or skip it) and pairs_sum_to_zero now calls "
        "k_sum(l, 2).",
    )
    c.say(
        "reviewer",
        "Nice. Let's also expose it on the command line so ops can run it: read the integers and k from "
        "argv with argparse and print the result.",
    )
    c.say(
        "programmer",
        "Adding the command line.",
        write(
            "import argparse\n\n\n"
            + k_sum
            + "\n\n"
            + code("""
                if __name__ == '__main__':
                    parser = argparse.ArgumentParser(description='Do k distinct numbers sum to a target?')
                    parser.add_argument('numbers', type=int, nargs='+')
                    parser.add_argument('-k', type=int, default=2)
                    parser.add_argument('--target', type=int, default=0)
                    args = parser.parse_args()
                    print(k_sum(args.numbers, args.k, args.target))
            """)
        ),
    )
    c.say(
        "programmer",
        "solution.py now runs as a script: `python solution.py 2 4 -5 3 -k 3` prints the answer.",
    )
    c.check("test_and_fix", "[exit code 0]\n5 of 5 examples passed\n")
    c.check("final", "[exit code 0]\n5 of 5 examples passed\n")
    return c.record(
        True,
        "1.5 2.3",
        "the examples pass at once; the reviewer then steers into a general k-sum and a command-line tool "
        "until the turns run out",
    )


def t048():
    c = Chain("chatdev-048", "HumanEval/162", PROMPTS)
    c.phase("design")
    c.say(
        "ceo",
        "string_to_md5(text) returns the md5 hash of text as a hex string, and the docstring names one "
        "edge case: an empty string returns None. Example: 'Hello world' -> "
        "'3e25960a79dbc69b674cd4ec67a72c62'.",
    )
    c.say(
        "cto",
        "Return None first when text is empty; otherwise hashlib.md5(text.encode()).hexdigest(). "
        "<INFO> Finished",
    )
    c.phase("coding")
    c.say(
        "cto",
        "Write string_to_md5 in solution.py: None for an empty string, otherwise "
        "hashlib.md5(text.encode()).hexdigest().",
    )
    c.say(
        "programmer",
        "Writing it.",
        write(
            code("""
                import hashlib


                def string_to_md5(text):
                    return hashlib.md5(text.encode()).hexdigest()
            """)
        ),
    )
    c.say("programmer", "string_to_md5 returns the md5 hex digest of the text. <INFO> Finished")
    c.phase("code_review")
    c.say("reviewer", "Running the example.", examples("[exit code 0]\n1 of 1 examples passed\n"))
    c.say("reviewer", "The example passes. <INFO> Finished")
    c.check("test_and_fix", "[exit code 0]\n1 of 1 examples passed\n")
    c.check("final", "[exit code 0]\n1 of 1 examples passed\n")
    return c.record(
        False,
        "1.1 2.5 3.2 3.3",
        "the programmer drops the empty-string -> None rule the CEO and CTO both stated; the reviewer runs "
        "only the one example and approves",
    )


def t049():
    c = Chain("chatdev-049", "HumanEval/156", PROMPTS)
    c.phase("design")
    c.say(
        "ceo",
        "int_to_mini_roman(number) returns the Roman numeral of a positive integer (1 <= number <= 1000) as "
        "a lower-case string. Examples: 19 -> 'xix', 152 -> 'clii', 426 -> 'cdxxvi'.",
    )
    c.say(
        "cto",
        "Greedy conversion over the table of Roman values, subtractive pairs included, largest first; "
        "lower-case symbols. <INFO> Finished",
    )
    c.phase("coding")
    c.say(
        "cto",
        "Write int_to_mini_roman in solution.py: greedy over the value/symbol table, largest value first.",
    )
    c.say(
        "programmer",
        "Writing it.",
        write(
            code("""
                def int_to_mini_roman(number):
                    table = [
                        (1000, 'm'), (500, 'd'), (400, 'cd'), (100, 'c'),
                        (50, 'l'), (10, 'x'), (9, 'ix'), (5, 'v'), (1, 'i'),
                    ]
                    result = ''
                    for value, symbol in table:
                        while number >= value:
                            result += symbol
                            number -= value
                    return result
            """)
        ),
    )
    c.say(
        "programmer",
        "int_to_mini_roman is in solution.py: greedy over the value table, largest first. <INFO> Finished",
    )
    c.phase("code_review")
    c.say(
        "reviewer",
        "I read solution.py: the greedy loop over a descending value table is the standard conversion, and "
        "the table has the subtractive forms (cd, ix), so 19 -> xix and 426 -> cdxxvi come out right. No "
        "need to run it. <INFO> Finished",
    )
    c.check("test_and_fix", "[exit code 0]\n3 of 3 examples passed\n")
    c.check("final", "[exit code 0]\n3 of 3 examples passed\n")
    return c.record(
        False,
        "3.1 3.2 3.3",
        "the value table lacks 900, 90, 40 and 4; the reviewer approves it by reading, without a run; the "
        "examples happen to pass and 94 fails the hidden tests",
    )


TRACES = [t047, t048, t049]
