"""Decoding: incremental greedy/beam search, LM sampling, translation of id batches and sacreBLEU."""
from .bleu import BleuResult, bleu_on_split, corpus_bleu
from .sampling import filter_logits, sample_lm
from .search import BeamResult, beam_search, greedy_search, length_penalty, max_target_lengths
from .translate import DecodeOptions, decode_batch, translate_ids

__all__ = ["BleuResult", "bleu_on_split", "corpus_bleu", "filter_logits", "sample_lm", "BeamResult",
           "beam_search", "greedy_search", "length_penalty", "max_target_lengths", "DecodeOptions",
           "decode_batch", "translate_ids"]
