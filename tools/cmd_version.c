/* `ninfer version` (also `ninfer --version`): version, git hash, and what CUDA can do here. */
#include <stdio.h>

#include "backend/cuda/cuda_backend.h"
#include "cli.h"
#include "commands.h"
#include "ninfer.h"

int nf_cmd_version(int argc, char **argv)
{
    static const nf_cmd_usage u = {
        .name = "version",
        .synopsis = "",
        .description = "Print the version, the git commit it was built from, whether the CUDA backend was\n"
                       "compiled in and which GPUs are visible.",
    };
    char *pos[1];
    int npos;
    int r = nf_cli_parse(&u, argc, argv, pos, &npos);
    if (r) return r == NF_CLI_HELP ? 0 : 2;

    printf("ninfer %s (git %s)\n", nf_version(), nf_git_hash());
    if (!nf_cuda_compiled()) {
        printf("cuda: not compiled in\n");
        return 0;
    }
    char why[256] = "";
    int n = nf_cuda_device_count(why, sizeof why);
    printf("cuda: compiled in (%s)\n", nf_cuda_archs());
    if (n == 0) {
        printf("gpu: none visible (%s)\n", why);
        return 0;
    }
    for (int d = 0; d < n; d++) {
        char desc[256];
        if (nf_cuda_device_describe(d, desc, sizeof desc) == 0) printf("gpu %d: %s\n", d, desc);
    }
    return 0;
}
