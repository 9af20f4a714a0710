/* schemes.h — the remote schemes ckptfs reads: one table, one row each (scheme.h).
 *
 * Contract:
 *  - http:// and https:// (a URL read as it is), hf:// (hub.h), s3:// (s3.h), gs:// (gcs.h).
 *    A location of none of them is a path, or a URL of a scheme ckptfs does not read
 *    (location.h), which ck_source_open refuses by name.
 *  - The transport asks the table through the hooks the opener hands it (http_config's
 *    authorize and explain): a request is authorised by the row whose endpoint it goes to.
 */
#ifndef CK_SCHEMES_H
#define CK_SCHEMES_H

#include <stddef.h>

#include "scheme.h"

/* The row of loc's scheme, or NULL for a path or a scheme no row knows. */
const ck_scheme *ck_scheme_of(const char *loc);

/* The schemes' names, ", "-separated, into out (cap bytes): what a refusal lists. */
void ck_scheme_names(char *out, size_t cap);

/* http_auth_fn over every row; the second without the rows an anonymous remote leaves
 * unsigned (ck_scheme's anonymous_unsigned). */
int ck_schemes_authorize(const char *url, http_auth *out);
int ck_schemes_authorize_anonymous(const char *url, http_auth *out);

/* http_explain_fn over every row: the first that knows the body's words. */
int ck_schemes_explain(const char *body, char *out, size_t cap);

#endif
