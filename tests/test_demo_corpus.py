import math

import numpy as np

from elmo_jax.text.demo_corpus import AMBIGUOUS_NOUNS, DemoCorpus, grammar


def test_size_and_floor():
    g = grammar()
    assert len(g.words) >= 2000
    assert g.floor_perplexity >= 20


def test_every_sentence_has_exactly_one_parse_and_the_floor_is_its_entropy():
    g = grammar()
    corpus = DemoCorpus("heldout")
    sentences = [corpus[i] for i in range(3000)]
    parses = [g.parses(s) for s in sentences]
    assert all(len(p) == 1 for p in parses)
    # Sample mean of -log p(sentence) per predicted token approaches the exact entropy rate.
    nll = -sum(p[0] for p in parses)
    tokens = sum(len(s) + 1 for s in sentences)
    h, length = g.expected_entropy()
    assert abs(nll / tokens - h / length) < 0.03
    assert abs(math.exp(nll / tokens) / g.floor_perplexity - 1) < 0.03


def test_ambiguous_words_occur_in_both_topics():
    g = grammar()
    corpus = DemoCorpus("train", size=20_000)
    topics_of = {w: set() for w in AMBIGUOUS_NOUNS}
    for i in range(len(corpus)):
        sentence = corpus[i]
        # Verbs and adjectives belong to one topic each: they tell the sentence's topic.
        topic = next(
            t for w in sentence for t in g.topics if w in g.categories[f"VERB:{t}"] or w in g.categories[f"ADJ:{t}"]
        )
        for w in sentence:
            if w in topics_of:
                topics_of[w].add(topic)
    assert all(topics_of[w] == set(ts) for w, ts in AMBIGUOUS_NOUNS.items())


def test_splits_are_deterministic_and_distinct():
    a, b = DemoCorpus("train", seed=0), DemoCorpus("train", seed=0)
    assert [a[i] for i in range(2000, 2010)] == [b[i] for i in range(2010)][2000:]
    held = DemoCorpus("heldout", seed=0)
    assert [a[i] for i in range(50)] != [held[i] for i in range(50)]
    assert len(a) == 200_000 and len(held) == 5_000
    assert np.mean([len(a[i]) for i in range(1000)]) > 6
