/* serve_chat_stub.c: TEMPORARY stand-ins for the chat template API
 * (include/spectra.h) until src/chat/ lands on main; removed by the merge
 * that brings it. They fail as an unimplemented construct would. */
#include "spectra.h"

#include <stdio.h>

static spx_status stub(char *err, size_t errcap) {
    if (err && errcap) snprintf(err, errcap, "chat templates are not built in yet (src/chat/)");
    return SPX_ERR_UNSUPPORTED;
}
spx_status spx_template_parse(const char *src, size_t len, const char *name, spx_template **out, char *err,
                              size_t errcap) {
    (void)src; (void)len; (void)name;
    *out = NULL;
    return stub(err, errcap);
}
void spx_template_free(spx_template *t) { (void)t; }
spx_status spx_chat_render(const spx_model *m, const spx_template *t, const char *messages_json,
                           const char *tools_json, int add_generation_prompt, char **out, size_t *out_len, char *err,
                           size_t errcap) {
    (void)m; (void)t; (void)messages_json; (void)tools_json; (void)add_generation_prompt;
    *out = NULL;
    if (out_len) *out_len = 0;
    return stub(err, errcap);
}
