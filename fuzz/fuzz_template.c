/* fuzz_template.c: libFuzzer target for the chat template engine
 * (src/chat/): the input is a template, parsed and, when it parses,
 * rendered with a fixed conversation (system/user/assistant turns, tools,
 * a tool call and its result).
 *
 * Either call may fail, but a failure must carry a message that starts
 * with the template's name and a position, and a success must give a
 * NUL-terminated text of the length it reports. Limits (nesting, output,
 * memory, steps) keep every input bounded. Seeds: fuzz/seeds_template.sh
 * (the test templates). */
#include "spectra.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char CTX[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": \"Hi \\u00e9!\"},"
    " {\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": [{\"id\": \"abcdefghi\", \"type\": \"function\","
    " \"function\": {\"name\": \"f\", \"arguments\": {\"x\": 1.5}}}]}, {\"role\": \"tool\", \"tool_call_id\": \"abcdefghi\","
    " \"content\": \"42\"}, {\"role\": \"assistant\", \"content\": \"<think>\\nr\\n</think>\\n\\nok\"}],"
    " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"description\": \"d\", \"parameters\":"
    " {\"type\": \"object\", \"properties\": {\"x\": {\"type\": \"number\"}}, \"required\": [\"x\"]}}}],"
    " \"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\", \"documents\": null}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[512];
    spx_template *t = NULL;
    if (spx_template_parse((const char *)data, size, "fz", &t, err, sizeof err) != SPX_OK) {
        if (t || strncmp(err, "fz:", 3)) __builtin_trap();
        return 0;
    }
    char *out = NULL;
    size_t n = 0;
    spx_status st = spx_template_render(t, CTX, &out, &n, err, sizeof err);
    if (st == SPX_OK) {
        if (!out || strlen(out) > n || out[n] != 0) __builtin_trap();
    } else if (out || strncmp(err, "fz:", 3)) {
        __builtin_trap();
    }
    free(out);
    spx_template_free(t);
    return 0;
}
