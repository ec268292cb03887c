"""Reading token ids, text through a vocabulary, CSV rows and arrays, and checking them against a model."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gradscope.core.errors import InputError
from gradscope.core.graph import LayerGraph, NodeSpec
from gradscope.io.model_inputs import array_input, table_input, token_input, typed_input
from gradscope.io.sequences import Vocabulary, parse_token_ids, read_csv_row, read_token_file


def embed_node(source: str, length: int | None, vocab_size: int) -> NodeSpec:
    """An ``Embedding`` of width 4 fed by the integer input ``source``."""
    ins, outs = ((None, length),), ((None, length, 4),)
    return NodeSpec("embed", "embed", "Embedding", (source,), ins, outs, "float32", config={"input_dim": vocab_size})


def text_graph(length: int | None = 6, vocab_size: int = 10) -> LayerGraph:
    """tokens (int32) -> embed (Embedding) -> out: the shape of a text classifier, no TensorFlow needed."""
    nodes = (
        NodeSpec("tokens", "tokens", "InputLayer", (), (), ((None, length),), "int32", is_input=True),
        embed_node("tokens", length, vocab_size),
        NodeSpec("out", "out", "Dense", ("embed",), ((None, length, 4),), ((None, 2),), "float32", is_output=True),
    )
    return LayerGraph(nodes, ("tokens",), ("out",))


def table_graph(features: int = 3) -> LayerGraph:
    nodes = (
        NodeSpec("x", "x", "InputLayer", (), (), ((None, features),), "float32", is_input=True),
        NodeSpec("out", "out", "Dense", ("x",), ((None, features),), ((None, 2),), "float32", is_output=True),
    )
    return LayerGraph(nodes, ("x",), ("out",))


def test_vocabularies_from_lines_lists_and_objects(tmp_path):
    (tmp_path / "v.txt").write_text("\n[UNK]\nthe\nmovie\n")
    v = Vocabulary.load(tmp_path / "v.txt")
    assert len(v) == 4 and v.encode("The movie, zebra").tolist() == [2, 3, 1, 1]  # case folded, unknowns -> [UNK]
    assert v.decode([3, 2, 9]) == ["movie", "the", "#9"]
    (tmp_path / "v.json").write_text(json.dumps({"a": 0, "b": 3}))
    assert Vocabulary.load(tmp_path / "v.json").tokens == ("a", None, None, "b")
    (tmp_path / "l.json").write_text(json.dumps(["x", "y"]))
    assert Vocabulary.load(tmp_path / "l.json").encode("y x").tolist() == [1, 0]
    strict = Vocabulary(("the", "movie"), "v.txt")
    with pytest.raises(InputError, match="Word 1 'zebra' is not in the vocabulary"):
        strict.encode("the zebra")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(InputError, match="not valid JSON"):
        Vocabulary.load(tmp_path / "bad.json")
    with pytest.raises(InputError, match="does not exist"):
        Vocabulary.load(tmp_path / "missing.txt")


def test_token_ids_typed_or_read_from_files(tmp_path):
    assert parse_token_ids("12 7,99 [3]").tolist() == [12, 7, 99, 3]
    with pytest.raises(InputError, match="Token 1 'seven' is not a token id"):
        parse_token_ids("12 seven")
    with pytest.raises(InputError, match="No token ids"):
        parse_token_ids("  ")
    (tmp_path / "ids.txt").write_text("1 2\n3\n")
    (tmp_path / "ids.json").write_text(json.dumps({"ids": [4, 5]}))
    (tmp_path / "bad.json").write_text(json.dumps([1, 2.5]))
    assert read_token_file(tmp_path / "ids.txt").tolist() == [1, 2, 3]
    assert read_token_file(tmp_path / "ids.json").tolist() == [4, 5]
    with pytest.raises(InputError, match="bad.json: give the token ids as a JSON list"):
        read_token_file(tmp_path / "bad.json")


def test_csv_rows_with_and_without_a_header(tmp_path):
    (tmp_path / "h.csv").write_text("age,income,score\n31,4.5,1e-3\n40,5,2\n")
    row = read_csv_row(tmp_path / "h.csv", 1)
    assert row.names == ("age", "income", "score") and row.values.tolist() == [40.0, 5.0, 2.0]
    (tmp_path / "n.csv").write_text("1,2,3\n")
    assert read_csv_row(tmp_path / "n.csv").names == ("col0", "col1", "col2")
    (tmp_path / "bad.csv").write_text("a,b\n1,x\n")
    with pytest.raises(InputError, match="row 0, column 'b' is 'x', not a number"):
        read_csv_row(tmp_path / "bad.csv")
    with pytest.raises(InputError, match="has 2 data row"):
        read_csv_row(tmp_path / "h.csv", 2)


def test_token_inputs_are_checked_against_the_model():
    g = text_graph()
    fed = token_input(g, [1, 2, 3, 4, 5, 6])
    assert fed.arrays[0].shape == (1, 6) and fed.tokens == ("1", "2", "3", "4", "5", "6") and fed.kind == "tokens"
    with pytest.raises(
        InputError, match="Input 'tokens' takes 6 token ids; got 3 \\(with no vocabulary, id 0 is not known"
    ):
        token_input(g, [1, 2, 3])
    with pytest.raises(InputError, match="takes 6 token ids; got 7.$"):
        token_input(g, list(range(7)))
    with pytest.raises(InputError, match="Token 2 of input 'tokens' is id 10, outside the embedding's vocabulary"):
        token_input(g, [1, 2, 10, 0, 0, 0])
    with pytest.raises(InputError, match="one sequence of whole numbers"):
        token_input(g, np.ones(6, np.float32))
    padded = typed_input(g, "the movie", Vocabulary(("", "[UNK]", "the", "movie")))
    assert padded.ids.tolist() == [2, 3, 0, 0, 0, 0] and padded.tokens[:2] == ("the", "movie")
    assert padded.note == "Padded 4 position(s) at the end with id 0 ('')."
    assert token_input(text_graph(None), [1, 2]).arrays[0].shape == (1, 2)  # any length fits a None length
    with pytest.raises(InputError, match="takes real numbers of shape \\(None, 3\\), not token ids"):
        token_input(table_graph(), [1, 2, 3])


def test_rows_and_arrays_are_checked_against_the_model(tmp_path):
    from gradscope.io.sequences import TableRow

    g = table_graph(3)
    row = TableRow(np.array([1, 2, 3], np.float32), ("a", "b", "c"))
    assert table_input(g, row).names == ("a", "b", "c")
    with pytest.raises(InputError, match="Input 'x' takes 3 features; the row has 2"):
        table_input(g, TableRow(np.array([1, 2], np.float32), ("a", "b")))
    np.savez(tmp_path / "named.npz", x=np.ones(3, np.float32))
    assert array_input(g, tmp_path / "named.npz").arrays[0].shape == (1, 3)  # one sample: a batch axis added
    np.save(tmp_path / "wide.npy", np.ones((2, 4), np.float32))
    with pytest.raises(InputError, match="Input 'x' takes shape \\(None, 3\\); wide.npy holds \\(2, 4\\)"):
        array_input(g, tmp_path / "wide.npy")
    np.savez(tmp_path / "wrong.npz", y=np.ones(3), z=np.ones(3))
    with pytest.raises(InputError, match="wrong.npz lacks input\\(s\\) 'x' of the model"):
        array_input(g, tmp_path / "wrong.npz")


def bert_graph(length: int = 6, vocab_size: int = 10, extra: str = "") -> LayerGraph:
    """keras_hub's BERT inputs: padding_mask, segment_ids, token_ids (int32), the ids into an embedding."""
    names = ["padding_mask", "segment_ids", "token_ids"] + ([extra] if extra else [])
    nodes = [NodeSpec(n, n, "InputLayer", (), (), ((None, length),), "int32", is_input=True) for n in names]
    nodes.append(embed_node("token_ids", length, vocab_size))
    nodes.append(NodeSpec("out", "out", "Dense", ("embed",), ((None, length, 4),), ((None, 2),), "float32"))
    return LayerGraph(tuple(nodes), tuple(names), ("out",))


def test_token_ids_feed_a_bert_style_model_with_its_mask_and_segments_derived():
    graph = bert_graph()
    assert graph.token_input == "token_ids"
    assert graph.token_companions == {"padding_mask": "mask", "segment_ids": "segment"}
    fed = token_input(graph, [2, 5, 9, 3])  # shorter: padded, and the padding mask hides the padding
    mask, segments, ids = fed.arrays
    np.testing.assert_array_equal(ids[0], [2, 5, 9, 3, 0, 0])
    np.testing.assert_array_equal(mask[0], [1, 1, 1, 1, 0, 0])
    np.testing.assert_array_equal(segments[0], np.zeros(6))
    assert "padding mask" in fed.note and fed.tokens == ("2", "5", "9", "3", "0", "0")
    vocab = Vocabulary(["[PAD]", "a", "b", "c", "d"])
    fed = token_input(graph, [1, 0, 3], vocab=vocab)  # a pad token inside the text is masked too
    np.testing.assert_array_equal(fed.arrays[0][0], [1, 0, 1, 0, 0, 0])
    with pytest.raises(InputError, match="'token_ids' is id 12"):
        token_input(graph, [1, 12])


def test_a_model_with_two_real_integer_inputs_is_not_a_token_model():
    graph = bert_graph(extra="item_ids")  # two inputs that are not derived from the ids
    assert graph.token_input is None and graph.token_companions == {}
    with pytest.raises(InputError, match="takes 4 inputs"):
        token_input(graph, [1, 2])
