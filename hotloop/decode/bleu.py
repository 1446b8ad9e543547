"""Corpus BLEU with sacrebleu (detokenized, case-sensitive, 13a tokenizer) and BLEU of a problem split."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

import torch

from ..errors import UserError
from ..hparams import HParams
from .translate import DecodeOptions, fit_source, translate_ids

__all__ = ["BleuResult", "corpus_bleu", "bleu_on_split", "translation_task", "is_text_translation",
           "TextSeq2SeqProblem"]


class TextSeq2SeqProblem(Protocol):
    """A seq2seq problem with a subword encoder and the raw text of its splits."""

    encoder: Any

    def split_text(self, split: str) -> dict[str, list[str]]: ...
    def spec(self, hp: HParams) -> Any: ...


@dataclass
class BleuResult:
    score: float                 # corpus BLEU, 0-100
    signature: str               # sacrebleu's signature, e.g. nrefs:1|case:mixed|eff:no|tok:13a|...
    sentences: int
    truncated: int = 0           # sources cut to the model's maximum input length
    hypotheses: list[str] = field(default_factory=list, repr=False)

    def __str__(self) -> str:
        return f"BLEU = {self.score:.2f} ({self.sentences} sentences) {self.signature}"


def corpus_bleu(hypotheses: Sequence[str], references: Sequence[str]) -> BleuResult:
    """sacreBLEU of detokenized ``hypotheses`` against one reference each (case-sensitive, 13a)."""
    try:
        from sacrebleu.metrics import BLEU
    except ImportError:
        raise UserError("BLEU needs sacrebleu: pip install sacrebleu") from None
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    metric = BLEU()   # defaults: tokenize=13a, lowercase=False, smooth=exp
    score = metric.corpus_score(list(hypotheses), [list(references)])
    return BleuResult(float(score.score), str(metric.get_signature()), len(hypotheses),
                      hypotheses=list(hypotheses))


def is_text_translation(problem: Any) -> bool:
    """Whether ``problem`` (an instance or its class) has raw split text and a subword encoder."""
    return hasattr(problem, "split_text") and hasattr(problem, "encoder")


def translation_task(model: Any, problem: Any, split: str) -> tuple[Any, Any, str]:
    """(decoder, text problem, split) that BLEU on ``split`` decodes with and scores against.

    A multi-problem run (a problem with ``subproblem``) names the task in the split,
    ``"test/<problem>"`` (the form of its evaluation splits), or has exactly one text
    translation problem; the decoder is then ``model.decoder_for(<problem>)``. Any other
    run decodes with ``model`` itself.
    """
    plain, _, task = split.partition("/")
    if not hasattr(problem, "subproblem"):
        return model, problem, split
    if not task:
        names = [n for n in problem.names if is_text_translation(problem.subproblem(n))]
        if len(names) != 1:
            raise UserError(f"split {split!r}: name the translation task, e.g. {plain}/<problem> "
                            f"(text translation problems in this run: {', '.join(names) or 'none'})")
        task = names[0]
    if not hasattr(model, "decoder_for"):
        raise UserError(f"model {type(model).__name__} cannot decode one task of a multi-problem run")
    return model.decoder_for(task), problem.subproblem(task), plain


def bleu_on_split(model: Any, problem: TextSeq2SeqProblem, hp: HParams, split: str, *, beam_size: int = 4,
                  alpha: float = 0.6, max_batches: int = 0, batch_size: int = 64, max_extra: int = 50,
                  device: torch.device | str | None = None) -> BleuResult:
    """Translate the raw source text of ``split`` and score it against its raw target text.

    A multi-problem run's task is chosen by :func:`translation_task` (``split="test/<problem>"``).
    With ``max_batches`` > 0 only the first ``max_batches * batch_size`` sentences (file order)
    are used. The model is put in eval mode for the call and restored after. Sources longer
    than the model's maximum input length are cut (counted in ``truncated``).
    """
    model, problem, split = translation_task(model, problem, split)
    if not is_text_translation(problem):
        raise UserError(f"problem {type(problem).__name__} has no raw split text and subword encoder; "
                        f"BLEU needs a text translation problem")
    text = problem.split_text(split)
    sources, references = text["inputs"], text["targets"]
    if max_batches > 0:
        sources, references = sources[: max_batches * batch_size], references[: max_batches * batch_size]
    limit = problem.spec(hp).max_input_length
    encoded, truncated = [], 0
    for ids in problem.encoder.encode_many(sources):
        ids, cut = fit_source(ids, limit)
        encoded.append(ids)
        truncated += cut
    device = device if device is not None else next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        outputs = translate_ids(model, encoded, DecodeOptions(beam_size=beam_size, alpha=alpha,
                                                              max_extra=max_extra),
                                batch_size=batch_size, device=device)
    finally:
        model.train(was_training)
    hypotheses = [problem.encoder.decode(ids) for ids in outputs]
    result = corpus_bleu(hypotheses, references)
    result.truncated = truncated
    return result
