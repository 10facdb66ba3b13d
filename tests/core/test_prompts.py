"""AUTOMATIC1111 prompt syntax: emphasis, BREAK and long prompts change the embeddings as A1111
would, checked against hand-computed expectations on tiny CLIP encoders with CLIP's real
tokenizer."""

from __future__ import annotations

import pytest
import torch

from app.core.encoders import prompts
from app.core.encoders.prompts import Fragment, chunk_prompt, parse_emphasis
from app.core.encoders.tokenizers import clip_tokenizer
from app.core.errors import HalfSafeError
from app.core.families import family_of
from tests.support.tiny_models import build_tiny_sd_pipeline, build_tiny_sdxl_pipeline

BOS, EOS = 49406, 49407
CAT = clip_tokenizer()("cat", add_special_tokens=False)["input_ids"][0]


@pytest.fixture(scope="module")
def sd():
    pipe = build_tiny_sd_pipeline()
    # A freshly initialised final norm makes every token's hidden state mean exactly 0, and
    # "restore the mean" would divide rounding noise by rounding noise; a trained CLIP's norm
    # has a bias (SD1's hidden states average about -0.1), so give the tiny one a bias too.
    with torch.no_grad():
        generator = torch.Generator().manual_seed(5)
        bias = pipe.text_encoder.final_layer_norm.bias
        bias.copy_(0.3 + 0.5 * torch.randn(bias.shape, generator=generator))
    return pipe


@pytest.fixture(scope="module")
def sdxl():
    return build_tiny_sdxl_pipeline()


def weights(prompt: str) -> list[tuple[str, float | None]]:
    return [
        (f.text, None if f.weight is None else round(f.weight, 6)) for f in parse_emphasis(prompt)
    ]


# --- the syntax ----------------------------------------------------------------------------


def test_emphasis_weights_follow_a1111():
    assert weights("a (cat:1.5) sat") == [("a ", 1.0), ("cat", 1.5), (" sat", 1.0)]
    assert weights("((cat))") == [("cat", round(1.1 * 1.1, 6))]
    assert weights("[cat]") == [("cat", round(1 / 1.1, 6))]
    assert weights("[[cat]]") == [("cat", round(1 / 1.1 / 1.1, 6))]
    assert weights("((cat:2))") == [("cat", 2.2)]  # an explicit weight, then one more paren
    assert weights("(a (b:2) c)") == [("a ", 1.1), ("b", 2.2), (" c", 1.1)]
    assert weights("(cat: 0.5 )") == [("cat", 0.5)]
    assert weights("(cat:-1)") == [("cat", -1.0)]


def test_escapes_unbalanced_brackets_and_stray_colons_are_text():
    assert weights(r"a \(cat\) \[dog\] \\") == [("a (cat) [dog] \\", 1.0)]
    assert weights("smile :) and :3") == [("smile :) and :3", 1.0)]
    assert weights("cat)") == [("cat)", 1.0)]
    assert weights("(cat") == [("cat", 1.1)]  # left open: closed at the end, as A1111 does
    assert weights("[cat") == [("cat", round(1 / 1.1, 6))]
    # Not a number: the text stays, and the bracket is left open (A1111 would fail here).
    assert weights("(cat:1.2.3)") == [("cat:1.2.3)", 1.1)]
    assert weights("") == [("", 1.0)]


def test_break_splits_fragments_and_is_a_word_only_in_capitals():
    assert weights("a BREAK b") == [("a", 1.0), ("BREAK", None), ("b", 1.0)]
    assert weights("a break b") == [("a break b", 1.0)]
    assert weights("BREAKFAST") == [("BREAKFAST", 1.0)]
    assert parse_emphasis("a BREAK BREAK b")[1:3] == [Fragment("BREAK", None)] * 2


def test_a_short_prompt_is_one_77_token_chunk_padded_as_the_tokenizer_pads():
    (chunk,) = chunk_prompt("a (cat:1.5)", clip_tokenizer())
    a = clip_tokenizer()("a", add_special_tokens=False)["input_ids"][0]
    assert chunk.tokens == (BOS, a, CAT, EOS, *[EOS] * 73)
    assert chunk.weights == (1.0, 1.0, 1.5, *[1.0] * 74)
    # SD2 and SDXL's second encoder pad with "!" (id 0) after the end token, as diffusers does.
    (chunk,) = chunk_prompt("a cat", clip_tokenizer(pad_token="!"))
    assert chunk.tokens[:4] == (BOS, a, CAT, EOS) and set(chunk.tokens[4:]) == {0}


def test_a_100_token_prompt_makes_two_chunks_and_keeps_the_tail():
    first, second = chunk_prompt("cat " * 100, clip_tokenizer())
    assert first.tokens == (BOS, *[CAT] * 75, EOS)
    assert second.tokens == (BOS, *[CAT] * 25, EOS, *[EOS] * 50)


def test_a_full_chunk_ends_at_a_recent_comma():
    # 70 cats, a comma, then 10 more: the chunk fills at 75 with the comma 4 tokens back, so it
    # ends after the comma and the 4 cats past it move to the next chunk.
    first, second = chunk_prompt("cat " * 70 + ", " + "cat " * 10, clip_tokenizer())
    assert len(first.tokens) == len(second.tokens) == 77
    assert first.tokens[71] == clip_tokenizer().get_vocab()[",</w>"]
    assert first.tokens[72:] == (EOS,) * 5
    assert second.tokens[1:11] == (CAT,) * 10 and second.tokens[11] == EOS


def test_break_starts_a_new_chunk():
    first, second = chunk_prompt("cat BREAK cat", clip_tokenizer())
    assert first.tokens[:3] == second.tokens[:3] == (BOS, CAT, EOS)


def test_absurd_prompts_are_refused_in_one_sentence():
    with pytest.raises(HalfSafeError, match="longer than 2,400 tokens"):
        chunk_prompt("cat " * 2401, clip_tokenizer())
    with pytest.raises(HalfSafeError, match="characters long"):
        parse_emphasis("cat " * 10_000)
    with pytest.raises(HalfSafeError, match="weight too large"):
        parse_emphasis("(cat:1" + "0" * 400 + ")")
    with pytest.raises(HalfSafeError, match="nest more than 50 deep"):
        parse_emphasis("(" * 51 + "cat")
    assert parse_emphasis("(" * 50 + "cat")[0].weight == pytest.approx(1.1**50)


# --- the embeddings ------------------------------------------------------------------------


def hidden_of(encoder, tokens) -> torch.Tensor:
    """The encoder's last hidden state for hand-made 77-token chunks."""
    with torch.no_grad():
        return encoder(torch.tensor(tokens))[0]


def a1111_emphasis(z: torch.Tensor, multipliers) -> torch.Tensor:
    """A1111's 'Original' emphasis on one chunk, written out from its description."""
    original_mean = z.mean()
    z = z * torch.tensor(multipliers)[None, :, None]
    return z * (original_mean / z.mean())


def encode(pipe, prompt: str, negative: str = "", guidance: bool = True):
    with torch.no_grad():
        return family_of(pipe).encode(pipe, prompt, negative, "cpu", guidance)


def test_a_plain_prompt_encodes_exactly_as_the_diffusers_pipeline(sd, sdxl):
    with torch.no_grad():
        embeds, negative = sd.encode_prompt("a red fox, snow", "cpu", 1, True, "blurry")
    ours = encode(sd, "a red fox, snow", "blurry")
    assert torch.equal(ours["prompt_embeds"], embeds)
    assert torch.equal(ours["negative_prompt_embeds"], negative)

    with torch.no_grad():
        reference = sdxl.encode_prompt(
            prompt="a red fox", device="cpu", do_classifier_free_guidance=True, negative_prompt="x"
        )
    ours = encode(sdxl, "a red fox", "x")
    names = ("prompt_embeds", "negative_prompt_embeds", "pooled_prompt_embeds")
    names += ("negative_pooled_prompt_embeds",)
    for name, expected in zip(names, reference, strict=True):
        torch.testing.assert_close(ours[name], expected, rtol=0, atol=1e-6)


def test_emphasis_scales_that_tokens_hidden_state_then_restores_the_mean(sd):
    (chunk,) = chunk_prompt("a cat", sd.tokenizer)
    z = hidden_of(sd.text_encoder, [chunk.tokens])
    multipliers = [1.0, 1.0, 1.5] + [1.0] * 74
    expected = a1111_emphasis(z, multipliers)

    got = encode(sd, "a (cat:1.5)")["prompt_embeds"]
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    assert got.mean().item() == pytest.approx(z.mean().item(), rel=1e-5)  # mean restored
    # Only the cat token changed direction; the others moved by one common factor.
    ratio = got[0, 1] / z[0, 1]
    torch.testing.assert_close(got[0, 5] / z[0, 5], ratio)
    assert not torch.allclose(got[0, 2] / z[0, 2], ratio)
    assert not torch.allclose(got, z)


def test_double_parentheses_and_square_brackets_weigh_1_21_and_1_over_1_1(sd):
    (chunk,) = chunk_prompt("a cat", sd.tokenizer)
    z = hidden_of(sd.text_encoder, [chunk.tokens])
    for prompt, weight in (("a ((cat))", 1.21), ("a [cat]", 1 / 1.1)):
        expected = a1111_emphasis(z, [1.0, 1.0, weight] + [1.0] * 74)
        torch.testing.assert_close(encode(sd, prompt)["prompt_embeds"], expected)


def test_a_100_token_prompt_gives_two_chunks_of_conditioning(sd):
    got = encode(sd, "cat " * 100)
    assert got["prompt_embeds"].shape == (1, 154, 32)
    first = hidden_of(sd.text_encoder, [(BOS, *[CAT] * 75, EOS)])
    second = hidden_of(sd.text_encoder, [(BOS, *[CAT] * 25, EOS, *[EOS] * 50)])
    torch.testing.assert_close(got["prompt_embeds"], torch.cat([first, second], dim=1))
    # The negative prompt gets as many chunks, the second an encoded empty chunk.
    empty = hidden_of(sd.text_encoder, [chunk_prompt("", sd.tokenizer)[0].tokens])
    assert got["negative_prompt_embeds"].shape == (1, 154, 32)
    torch.testing.assert_close(got["negative_prompt_embeds"][:, 77:], empty)


def test_emphasis_in_the_second_chunk_is_restored_per_chunk(sd):
    got = encode(sd, "cat " * 80 + "(dog:0.5)", guidance=False)["prompt_embeds"]
    dog = clip_tokenizer()("dog", add_special_tokens=False)["input_ids"][0]
    tokens = (BOS, *[CAT] * 5, dog, EOS, *[EOS] * 69)
    z = hidden_of(sd.text_encoder, [tokens])
    expected = a1111_emphasis(z, [1.0] * 6 + [0.5] + [1.0] * 70)
    torch.testing.assert_close(got[:, 77:], expected)
    first = hidden_of(sd.text_encoder, [(BOS, *[CAT] * 75, EOS)])
    torch.testing.assert_close(got[:, :77], first)  # the first chunk has no emphasis: untouched


def test_sdxl_long_prompt_concatenates_both_encoders_and_pools_from_the_first_chunk(sdxl):
    got = encode(sdxl, "cat " * 100, "(ugly:1.3)")
    assert got["prompt_embeds"].shape == (1, 154, 64)
    assert got["negative_prompt_embeds"].shape == (1, 154, 64)
    first_2 = (BOS, *[CAT] * 75, EOS)
    second_2 = (BOS, *[CAT] * 25, EOS, *[0] * 50)  # the second tokenizer pads with "!"
    with torch.no_grad():
        out = sdxl.text_encoder_2(torch.tensor([first_2, second_2]), output_hidden_states=True)
    torch.testing.assert_close(got["pooled_prompt_embeds"], out[0][:1])
    hidden_2 = torch.cat([out.hidden_states[-2][:1], out.hidden_states[-2][1:]], dim=1)
    torch.testing.assert_close(got["prompt_embeds"][..., 32:], hidden_2)


def test_every_family_step_takes_the_emphasised_embeddings(sd):
    """The check and generation both call the family's `encode`; its result feeds the UNet."""
    conditioning = encode(sd, "a (cat:1.5) " + "cat " * 90, "[blurry]")
    inputs = family_of(sd).denoiser_inputs(conditioning, 64, "cpu")
    assert inputs["encoder_hidden_states"].shape == (2, 154, 32)
    with torch.no_grad():
        out = sd.unet(torch.zeros(2, 4, 8, 8), 10, **inputs).sample
    assert torch.isfinite(out).all()


def test_emphasis_keeps_the_encoders_dtype(sd):
    import copy

    half = copy.deepcopy(sd)
    half.text_encoder.to(torch.float16)
    got = encode(half, "a (cat:1.5)")
    assert got["prompt_embeds"].dtype == torch.float16
    assert torch.isfinite(got["prompt_embeds"]).all()


def test_module_constants_match_a1111():
    assert (prompts.CHUNK_TOKENS, prompts.COMMA_BACKTRACK) == (75, 20)


def test_sd2_pads_with_its_own_pad_token_and_still_matches_its_pipeline(sd):
    """SD2's tokenizer pads with "!" (id 0) after the end token; a plain prompt then encodes
    exactly as the diffusers pipeline does, and a long one pads its last chunk the same way."""
    sd2 = type(sd)(**{**sd.components, "tokenizer": clip_tokenizer(pad_token="!")})
    with torch.no_grad():
        embeds, _ = sd2.encode_prompt("a red fox", "cpu", 1, True, "")
    assert torch.equal(encode(sd2, "a red fox")["prompt_embeds"], embeds)
    got = encode(sd2, "cat " * 100, guidance=False)["prompt_embeds"]
    second = hidden_of(sd2.text_encoder, [(BOS, *[CAT] * 25, EOS, *[0] * 50)])
    torch.testing.assert_close(got[:, 77:], second)
