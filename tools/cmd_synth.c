/* `ninfer synth --geometry G --recipe R -o model.nf [--layers N] [--seed S] [--vocab V]`: a full-size
 * artifact with deterministic random weights for a named geometry (src/convert/synth.h,
 * docs/synth.md), so full-size speed can be measured with no download. */
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>

#include "cli.h"
#include "commands.h"
#include "convert/recipe.h"
#include "convert/synth.h"

static int usage_error(const nf_cmd_usage *u, const char *msg, const char *value, const char *choices)
{
    fprintf(stderr, "ninfer: error: %s '%s' is not one of: %s\n", msg, value, choices);
    nf_cli_print_help(u, stderr);
    return 2;
}

int nf_cmd_synth(int argc, char **argv)
{
    const char *out = NULL, *geometry = NULL, *recipe = "bf16";
    long layers = 0, seed = 0, vocab = 0, threads = 0;
    int fresh = 0, no_tok = 0, quiet = 0;
    const nf_opt opts[] = {
        {"--geometry", 'g', NF_OPT_STRING, &geometry, "G",
         "qwen3-30b-a3b, qwen3.5-35b-a3b, qwen3-next-80b-a3b (the whole hybrids), qwen3.5-35b-a3b-moe (its MoE part "
         "on plain attention), qwen2-57b-a14b, tiny, tiny-qwen2, tiny-hybrid (required)", 0, 0},
        {"--recipe", 0, NF_OPT_STRING, &recipe, "R", "bf16, q8q8, q4q6, q4q5, nvfp4 (default bf16)", 0, 0},
        {"--output", 'o', NF_OPT_STRING, &out, "FILE", "the artifact to write (required)", 0, 0},
        {"--layers", 0, NF_OPT_INT, &layers, "N", "decoder layers (default: the geometry's)", 1, 100000},
        {"--seed", 's', NF_OPT_INT, &seed, "S", "random seed (default 0): the same seed gives the same bytes", 0, 9.0e15},
        {"--vocab", 0, NF_OPT_INT, &vocab, "V", "vocabulary size (default: the geometry's)", 1, 1 << 24},
        {"--threads", 't', NF_OPT_INT, &threads, "N", "encoding threads (default: all CPUs)", 0, 4096},
        {"--fresh", 0, NF_OPT_FLAG, &fresh, NULL,
         "encode every expert from its own random values (slow; default: experts 1.. permute expert 0's rows)", 0, 0},
        {"--no-tokenizer", 0, NF_OPT_FLAG, &no_tok, NULL, "omit the byte-level toy tokenizer", 0, 0},
        {"--quiet", 'q', NF_OPT_FLAG, &quiet, NULL, "no progress on stderr", 0, 0},
    };
    const nf_cmd_usage u = {
        "synth", "--geometry G [--recipe R] -o model.nf [--layers N] [--seed S] [--vocab V]",
        "Write a full-size artifact with deterministic random weights for a named geometry, encoded by the\n"
        "recipe's codecs as `ninfer convert` would (docs/synth.md). Matrices ~ N(0, 0.02^2), norms 1, routers\n"
        "wider (sd 2/sqrt(H)) so routing is peaked per token; random routers still spread tokens near-\n"
        "uniformly over the experts, unlike trained ones: say so next to any speed measured on these models.\n"
        "Expert 0 of each bank is encoded fresh, the others are row permutations of it (--fresh: all fresh).\n"
        "A byte-level toy tokenizer (ids 0-255 = bytes) lets `ninfer run -p` work.",
        opts, NF_CLI_COUNT(opts), 0, 0};
    int npos = 0;
    int r = nf_cli_parse(&u, argc, argv, NULL, &npos);
    if (r) return r == NF_CLI_HELP ? 0 : 2;
    if (!geometry || !out) {
        fprintf(stderr, "ninfer: error: synth needs --geometry G and -o FILE\n");
        nf_cli_print_help(&u, stderr);
        return 2;
    }
    if (!nf_synth_geometry_find(geometry)) return usage_error(&u, "--geometry", geometry, nf_synth_geometry_names());
    nf_codec_id c;
    if (nf_synth_codec(recipe, "token_embd", 1, 1, 0, 256, &c, NULL, NULL)) {
        char note[256], choices[320];
        snprintf(choices, sizeof choices, "bf16, q8q8, q4q6, q4q5, nvfp4%s", nf_recipe_codec_note(recipe, note, sizeof note));
        return usage_error(&u, "--recipe", recipe, choices);
    }
    if (!no_tok && vocab && vocab < 256) {
        fprintf(stderr, "ninfer: error: --vocab %ld is below the toy tokenizer's 256 byte tokens (add --no-tokenizer)\n",
                vocab);
        return 2;
    }
    nf_synth_opts o = {.geometry = geometry, .recipe = recipe, .seed = (uint64_t)seed, .layers = (uint32_t)layers,
                       .vocab = (uint32_t)vocab, .threads = (int)threads, .fresh = fresh, .no_tokenizer = no_tok,
                       .quiet = quiet};
    nf_synth_stats st;
    nf_error err = {0};
    if (nf_synth_write(out, &o, &st, &err)) return nf_cli_fail("synth: %s", err.msg);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    if (!quiet)
        fprintf(stderr, "synth: wrote %s: %llu tensors, %.3f B parameters, %.1f MB, %.2f s, %.1f MB/s, peak RSS %.1f MB\n",
                out, (unsigned long long)st.tensors, (double)st.params * 1e-9, (double)st.bytes / 1e6, st.seconds,
                st.seconds > 0 ? (double)st.bytes / 1e6 / st.seconds : 0.0, (double)ru.ru_maxrss / 1024.0);
    return 0;
}
