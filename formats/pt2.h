/* pt2.h — torch.export archives (.pt2: torch.export.save, package_pt2) into the common index.
 *
 * Contract:
 *  - A .pt2 is a zip whose root folder is its first record's; ROOT/archive_format says "pt2"
 *    and ROOT/byteorder, where present, "little". Each model M (a record
 *    ROOT/data/weights/M_weights_config.json, and ROOT/data/constants/M_constants_config.json
 *    beside it) lists its weights and tensor constants as JSON:
 *    {"config": {FQN: {"path_name", "use_pickle", "tensor_meta": {"dtype", "sizes", "strides",
 *    "storage_offset", "layout"}}}}, sizes and the rest as [{"as_int": N}]. Each becomes a
 *    tensor entry named FQN (with several models, "M." FQN), weights then constants, in the
 *    configs' order.
 *  - Its bytes are record ROOT/data/weights/<path_name> (constants: data/constants/), a stored
 *    record of the storage's raw little-endian elements, seen through sizes, element strides and
 *    storage_offset: one extent when row-major contiguous, else a strided gather. dtype is
 *    torch's ScalarType number (torch/_export/serde/schema.py); layout must be Strided (7).
 *  - A payload torch pickles (use_pickle: torch.save of a tensor subclass, or a custom
 *    object's pickle) is read as the torch.save archive it is, through the safe pickle VM
 *    (torch.h's pt_read_zip_or_omit): what it can show is shown under FQN, else FQN is an
 *    omission with the reason (a class outside the policy, not an archive). Empty records of
 *    tensors with elements (fake tensors, which torch loads as zeros) are omissions too.
 *  - Nothing is trusted unchecked: the configs pass ck_json_parse and are at most
 *    PT2_MAX_CONFIG bytes; each record must exist, be stored (a deflated one is refused) and
 *    hold every element the tensor reaches, a whole number of elements; a name given twice is
 *    refused. The graph (models/M.json) is not read. Only the directory, the configs and two
 *    small records are read: time linear in their size.
 */
#ifndef CK_PT2_H
#define CK_PT2_H

#include "../index/index.h"
#include "../index/zip.h"

#define PT2_MAX_CONFIG (256u << 20) /* bytes of one weights or constants config */

/* Whether the archive whose directory is z is a .pt2: its root folder holds archive_format or
 * data/weights/model_weights_config.json. */
int pt2_probe(const zip_archive *z);

/* Appends the entries of the .pt2 that is file `file` of ix, its directory z. */
int pt2_read_zip(ck_index *ix, uint32_t file, const zip_archive *z, ck_error *err);

#endif
