"""The argparse value types the inference tools share."""

from __future__ import annotations

import argparse

import pytest

from common.cli_types import fraction, non_negative_int, positive, positive_int, positive_int_list


@pytest.mark.parametrize(("parse", "text", "value"), [
    (positive_int, "3", 3), (positive(float), "0.5", 0.5), (non_negative_int, "0", 0),
    (positive_int_list, "1,4, 16", [1, 4, 16]), (fraction, "0.01", 0.01), (fraction, "1", 1.0)])
def test_good_values_parse(parse, text, value):
    assert parse(text) == value


@pytest.mark.parametrize(("parse", "text", "message"), [
    (positive_int, "0", "expected a positive integer, got '0'"),
    (positive_int, "two", "expected a positive integer, got 'two'"),
    (positive(float), "-1.5", "expected a positive number, got '-1.5'"),
    (non_negative_int, "-1", "expected a whole number, 0 or more, got '-1'"),
    (positive_int_list, "1,0", "expected positive integers separated by commas, got '1,0'"),
    (positive_int_list, ",", "expected positive integers separated by commas"),
    (fraction, "1.5", "expected a fraction between 0 and 1, got '1.5'"),
    (fraction, "half", "expected a fraction between 0 and 1, got 'half'")])
def test_bad_values_name_the_value_and_what_is_allowed(parse, text, message):
    with pytest.raises(argparse.ArgumentTypeError, match=message.replace(".", r"\.")):
        parse(text)
