/* dcp.h — torch.distributed.checkpoint (DCP) checkpoints: a `.metadata` pickle and the
 * `.distcp` files beside it, each a run of torch.save archives laid end to end.
 *
 * Contract: the metadata is decoded by the safe VM with the DCP classes allowed
 * (pk_dcp_limits), never executed; the .distcp files it names are opened beside it
 * (ck_source_sibling: plain file names only). Every tensor is one entry at its global shape:
 * one chunk covering it is a plain extent, several are CK_CHUNKED. Its chunks must tile it as
 * a grid (every chunk one cell of the grid their edges draw, every cell one chunk: what
 * DTensor placements write), agree with its dtype, and each be a tensor of the chunk's sizes
 * in a torch.save archive lying inside its file, contiguous or a view saved as it was (a
 * transposed weight: a strided entry, or a strided chunk, gathered as torch.load reads it);
 * else one error naming the tensor and chunk. A bytes value (optimizer step, RNG state) becomes the entries its archive
 * holds, named by its fully-qualified name, or an omission with the reason when it holds
 * what the reader cannot show. Linear in the metadata and the archives' directories, plus a
 * sort of the storage records: an archive that several records name is parsed once
 * (torch.h's pt_archives).
 */
#ifndef CK_DCP_H
#define CK_DCP_H

#include "../sources/http.h"
#include "../index/index.h"

#define DCP_METADATA ".metadata"

/* Whether loc (a path or URL) names a .metadata file itself. */
int dcp_is_metadata(const char *loc);

/* Opens the DCP checkpoint whose .metadata is at meta (a path or URL) into *out. */
int dcp_open(http_remote *remote, const char *meta, ck_index **out, ck_error *err);

#endif
