package nbd

// Wire constants of the NBD protocol (NetworkBlockDevice/nbd doc/proto.md). All
// integers on the wire are big-endian.

// Handshake magics.
const (
	nbdMagic         = 0x4e42444d41474943 // "NBDMAGIC"
	ihaveOpt         = 0x49484156454F5054 // "IHAVEOPT"
	optReplyMagic    = 0x3e889045565a9
	requestMagic     = 0x25609513
	simpleReplyMagic = 0x67446698
)

// Handshake flags (server, 16 bits) and client flags (32 bits).
const (
	flagFixedNewstyle  = 1 << 0
	flagNoZeroes       = 1 << 1
	flagCFixedNewstyle = 1 << 0
	flagCNoZeroes      = 1 << 1
)

// Transmission flags (16 bits), sent in NBD_INFO_EXPORT and after NBD_OPT_EXPORT_NAME.
const (
	flagHasFlags        = 1 << 0
	flagReadOnly        = 1 << 1
	flagSendFlush       = 1 << 2
	flagSendFUA         = 1 << 3
	flagSendTrim        = 1 << 5
	flagSendWriteZeroes = 1 << 6
	flagCanMultiConn    = 1 << 8
)

// Option types.
const (
	optExportName      = 1
	optAbort           = 2
	optList            = 3
	optStartTLS        = 5
	optInfo            = 6
	optGo              = 7
	optStructuredReply = 8
)

// Option reply types; errors have bit 31 set.
const (
	repAck        = 1
	repServer     = 2
	repInfo       = 3
	repErrUnsup   = 1<<31 + 1
	repErrPolicy  = 1<<31 + 2
	repErrInvalid = 1<<31 + 3
	repErrTLSReqd = 1<<31 + 5
	repErrUnknown = 1<<31 + 6
	repErrTooBig  = 1<<31 + 9
)

// NBD_INFO types inside NBD_REP_INFO.
const (
	infoExport      = 0
	infoName        = 1
	infoDescription = 2
	infoBlockSize   = 3
)

// Commands.
const (
	cmdRead        = 0
	cmdWrite       = 1
	cmdDisc        = 2
	cmdFlush       = 3
	cmdTrim        = 4
	cmdWriteZeroes = 6
)

// Command flags.
const (
	cmdFlagFUA    = 1 << 0
	cmdFlagNoHole = 1 << 1
)

// NBD error values, sent in the error field of a simple reply. They are plain
// uint32 so that an ErrorCode hook can return them without conversion.
const (
	EPERM     uint32 = 1   // operation not permitted (read-only export, fenced writer)
	EIO       uint32 = 5   // input/output error
	ENOMEM    uint32 = 12  // cannot allocate memory
	EINVAL    uint32 = 22  // invalid argument
	ENOSPC    uint32 = 28  // no space left on device
	EOVERFLOW uint32 = 75  // value too large
	ENOTSUP   uint32 = 95  // operation not supported
	ESHUTDOWN uint32 = 108 // server is shutting down
)

// Sizes of fixed wire structures.
const (
	requestHeaderLen = 28 // magic 4, flags 2, type 2, cookie 8, offset 8, length 4
	replyHeaderLen   = 16 // magic 4, error 4, cookie 8
	optionHeaderLen  = 16 // IHAVEOPT 8, option 4, length 4
	maxStringLen     = 4096
)
