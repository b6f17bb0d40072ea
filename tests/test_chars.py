import numpy as np
import pytest

from elmo_jax.text.chars import CharTable, token_char_ids


def spec_chars(token: str) -> list[int]:
    """docs/MODEL.md section 2, written out per token."""
    if token == "<S>":
        body = [256]
    elif token == "</S>":
        body = [257]
    else:
        body = list(token.encode("utf-8", "ignore")[:48])
    ids = [258] + body + [259]
    ids += [260] * (50 - len(ids))
    return [i + 1 for i in ids]


TRICKY = [
    "the",
    "",
    "<S>",
    "</S>",
    "<UNK>",
    "é" * 30,  # 60 bytes: cut at 48 bytes, between two characters
    "a" + "€" * 20,  # 61 bytes: cut at 48 bytes, inside the 16th three-byte character
    "日本語のテキスト",
    "Привет",
    "x" * 48,
    "x" * 49,
    "emoji🙂",
]


def test_encode_tokens_matches_spec():
    got = token_char_ids(TRICKY)
    assert got.shape == (len(TRICKY), 50) and got.dtype == np.int32
    for row, token in zip(got, TRICKY):
        assert row.tolist() == spec_chars(token), token


def test_multibyte_cut_inside_a_character():
    row = token_char_ids(["a" + "€" * 20])[0]
    raw = bytes(int(i) - 1 for i in row[1:49])
    assert raw == ("a" + "€" * 20).encode()[:48]
    assert row[49] == 259 + 1  # end of word right after the 48th byte
    assert row[48] == raw[-1] + 1 and raw[-1] == 0x82  # the 3-byte "€" was cut after 2 bytes


def test_empty_token_is_a_word_not_padding():
    row = token_char_ids([""])[0]
    assert row[:3].tolist() == [259, 260, 261] and (row > 0).all()


def test_char_table_caches_and_grows():
    table = CharTable()
    words = [f"w{i}" for i in range(3000)] + ["w1", "<S>"]
    np.testing.assert_array_equal(table.encode(words), token_char_ids(words))
    first = table.ids(["w5", "w5", "new"])
    assert first[0] == first[1] == 5
    np.testing.assert_array_equal(table.lookup(first), token_char_ids(["w5", "w5", "new"]))


@pytest.mark.parametrize("max_chars, last", [(10, 259 + 1), (50, 260 + 1)])
def test_max_chars(max_chars, last):
    row = token_char_ids(["abcdefghijklmnop"], max_chars)[0]
    assert len(row) == max_chars and row[max_chars - 1] == last  # cut word ends in end-of-word
