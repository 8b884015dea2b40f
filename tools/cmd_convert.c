/* `ninfer convert <hf-dir|file.gguf> -o model.nf [--recipe R] [--plan] [--requantize] [--threads N] [--hash-bytes]`:
 * a Hugging Face checkpoint or a GGUF file into an artifact (docs/convert.md). --plan prints what
 * would be written (codecs, stacking, divisors, input divisors) and writes nothing. */
#include <stdio.h>
#include <sys/resource.h>

#include "cli.h"
#include "commands.h"
#include "convert/convert.h"
#include "convert/plan.h"

int nf_cmd_convert(int argc, char **argv)
{
    const char *out = NULL, *recipe = NULL;
    int plan_only = 0, requantize = 0, quiet = 0, hash_bytes = 0;
    long threads = 0;
    const nf_opt opts[] = {
        {"--output", 'o', NF_OPT_STRING, &out, "FILE", "the artifact to write (required unless --plan)", 0, 0},
        {"--recipe", 0, NF_OPT_STRING, &recipe, "R",
         "bf16, q8q8, q4q6, q4q5, nvfp4, source (default: bf16 for HF, nvfp4 for NVFP4 HF, source for GGUF)", 0, 0},
        {"--plan", 0, NF_OPT_FLAG, &plan_only, NULL, "print the plan and write nothing", 0, 0},
        {"--requantize", 0, NF_OPT_FLAG, &requantize, NULL, "allow an NVFP4 source into a non-NVFP4 recipe", 0, 0},
        {"--threads", 't', NF_OPT_INT, &threads, "N", "encoding threads (default: all CPUs)", 0, 4096},
        {"--hash-bytes", 0, NF_OPT_FLAG, &hash_bytes, NULL,
         "provenance.source_hash over the source bytes (a full extra read; default: names, sizes, mtimes)", 0, 0},
        {"--quiet", 'q', NF_OPT_FLAG, &quiet, NULL, "no progress on stderr", 0, 0},
    };
    const nf_cmd_usage u = {"convert", "<hf-dir|file.gguf> -o model.nf [--recipe R] [--plan] [--requantize]",
                            "Convert a Hugging Face checkpoint folder (bf16, compressed-tensors or ModelOpt NVFP4) or a\n"
                            "GGUF file into a .nf artifact. The plan decides every tensor's codec, stacking and divisors.",
                            opts, NF_CLI_COUNT(opts), 1, 1};
    char *pos[1];
    int npos = 0;
    int r = nf_cli_parse(&u, argc, argv, pos, &npos);
    if (r) return r == NF_CLI_HELP ? 0 : 2;
    if (!plan_only && !out) {
        fprintf(stderr, "ninfer: error: convert: -o FILE is required (or --plan)\n");
        return 2;
    }
    nf_convert_opts o = {recipe, requantize, (int)threads, quiet};
    nf_plan p;
    nf_error err = {0};
    if (nf_plan_build(pos[0], &o, &p, &err) != NF_OK) {
        nf_plan_free(&p);
        return nf_cli_fail("convert: %s", err.msg);
    }
    p.hash_bytes = hash_bytes;
    if (plan_only) {
        nf_plan_print(&p, stdout);
        nf_plan_free(&p);
        return 0;
    }
    nf_convert_stats st;
    nf_status s = nf_convert_run(&p, out, &o, &st, &err);
    nf_plan_free(&p);
    if (s) return nf_cli_fail("convert: %s", err.msg);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    if (!quiet)
        fprintf(stderr, "convert: wrote %s: %.1f MB in, %.1f MB out, %.2f s, %.1f MB/s in, peak RSS %.1f MB\n", out,
                (double)st.bytes_in / 1e6, (double)st.bytes_out / 1e6, st.seconds,
                st.seconds > 0 ? (double)st.bytes_in / 1e6 / st.seconds : 0.0, (double)ru.ru_maxrss / 1024.0);
    return 0;
}
