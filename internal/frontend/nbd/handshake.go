package nbd

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/basalt-storage/basalt/internal/frontend"
)

const (
	// maxOptionLen bounds an option's data: a maximal export name (4096 bytes)
	// plus its length, the info count and room for 253 info requests. A longer
	// option is answered NBD_REP_ERR_TOO_BIG and the connection is closed (its
	// data is never read, so the stream cannot be resynchronised).
	maxOptionLen = maxStringLen + 512
	// maxOptions bounds the options of one handshake; a client that sends more
	// is treated as a denial of service and disconnected.
	maxOptions = 256
)

// handshakeResult says how option haggling ended.
type handshakeResult int

const (
	handshakeClose    handshakeResult = iota // abort, violation or I/O error: close
	handshakeTransmit                        // export chosen: enter transmission
)

// handshake runs the fixed newstyle negotiation on c.nc. On handshakeTransmit,
// c.backend, c.export and c.tflags are set. The returned error explains a
// handshakeClose that was not a clean NBD_OPT_ABORT.
func (c *conn) handshake() (handshakeResult, error) {
	w := bufio.NewWriterSize(c.stream, 4096)
	c.deadline()
	var hello [18]byte
	binary.BigEndian.PutUint64(hello[0:], nbdMagic)
	binary.BigEndian.PutUint64(hello[8:], ihaveOpt)
	binary.BigEndian.PutUint16(hello[16:], flagFixedNewstyle|flagNoZeroes)
	w.Write(hello[:])
	if err := w.Flush(); err != nil {
		return handshakeClose, err
	}
	var cflags [4]byte
	if _, err := io.ReadFull(c.br, cflags[:]); err != nil {
		return handshakeClose, err
	}
	cf := binary.BigEndian.Uint32(cflags[:])
	if cf&^(flagCFixedNewstyle|flagCNoZeroes) != 0 {
		return handshakeClose, fmt.Errorf("%w: unknown client flags %#x", ErrProtocol, cf)
	}
	noZeroes := cf&flagCNoZeroes != 0

	var hdr [optionHeaderLen]byte
	data := make([]byte, 0, 256)
	for n := 0; ; n++ {
		if n == maxOptions {
			return handshakeClose, fmt.Errorf("%w: more than %d options", ErrProtocol, maxOptions)
		}
		c.deadline()
		if _, err := io.ReadFull(c.br, hdr[:]); err != nil {
			return handshakeClose, err
		}
		if m := binary.BigEndian.Uint64(hdr[0:]); m != ihaveOpt {
			return handshakeClose, fmt.Errorf("%w: option magic %#x", ErrProtocol, m)
		}
		opt := binary.BigEndian.Uint32(hdr[8:])
		length := binary.BigEndian.Uint32(hdr[12:])
		if length > maxOptionLen {
			if opt != optExportName {
				optReply(w, opt, repErrTooBig, []byte("option data too long"))
				w.Flush()
			}
			return handshakeClose, fmt.Errorf("%w: option %d with %d bytes of data", ErrProtocol, opt, length)
		}
		if cap(data) < int(length) {
			data = make([]byte, length)
		}
		data = data[:length]
		if _, err := io.ReadFull(c.br, data); err != nil {
			return handshakeClose, err
		}

		if c.policy == TLSRequire && c.tls == nil && opt != optStartTLS && opt != optAbort {
			if opt == optExportName {
				// Cannot be answered with an error: the spec says to close.
				return handshakeClose, fmt.Errorf("%w: NBD_OPT_EXPORT_NAME before NBD_OPT_STARTTLS on a listener that requires TLS", ErrTLSRequired)
			}
			optReply(w, opt, repErrTLSReqd, []byte("this server requires TLS: use NBD_OPT_STARTTLS (an nbds:// URI with a client certificate)"))
			if err := w.Flush(); err != nil {
				return handshakeClose, err
			}
			continue
		}

		switch opt {
		case optStartTLS:
			switch {
			case c.policy == TLSOff:
				optReply(w, opt, repErrUnsup, []byte("TLS is not offered on this listener"))
			case length != 0:
				optReply(w, opt, repErrInvalid, []byte("NBD_OPT_STARTTLS takes no data"))
			case c.tls != nil:
				optReply(w, opt, repErrInvalid, []byte("TLS is already negotiated"))
			default:
				if err := c.startTLS(w); err != nil {
					c.log.Info("nbd: TLS refused", "err", err)
					return handshakeClose, err
				}
			}

		case optExportName:
			name := string(data)
			a, err := c.attach(name)
			if err != nil {
				// No way to report an error to NBD_OPT_EXPORT_NAME: the spec
				// says to terminate the session.
				return handshakeClose, err
			}
			var reply [10 + 124]byte
			binary.BigEndian.PutUint64(reply[0:], uint64(c.size))
			binary.BigEndian.PutUint16(reply[8:], c.tflags)
			if noZeroes {
				w.Write(reply[:10])
			} else {
				w.Write(reply[:])
			}
			if err := w.Flush(); err != nil {
				a.Detach()
				return handshakeClose, err
			}
			c.use(name, a)
			return handshakeTransmit, nil

		case optAbort:
			optReply(w, opt, repAck, nil)
			w.Flush()
			return handshakeClose, nil

		case optList:
			if length != 0 {
				optReply(w, opt, repErrInvalid, []byte("NBD_OPT_LIST takes no data"))
				break
			}
			for _, name := range c.list() {
				if len(name) > maxStringLen {
					continue
				}
				entry := make([]byte, 4+len(name))
				binary.BigEndian.PutUint32(entry, uint32(len(name)))
				copy(entry[4:], name)
				optReply(w, opt, repServer, entry)
			}
			optReply(w, opt, repAck, nil)

		case optInfo, optGo:
			a, name, ok := c.infoGo(w, opt, data)
			if ok && opt == optGo {
				if err := w.Flush(); err != nil {
					a.Detach()
					return handshakeClose, err
				}
				c.use(name, a)
				return handshakeTransmit, nil
			}

		default:
			// NBD_OPT_STRUCTURED_REPLY (simple replies only), meta contexts,
			// extended headers and anything unknown.
			optReply(w, opt, repErrUnsup, nil)
		}
		if err := w.Flush(); err != nil {
			return handshakeClose, err
		}
	}
}

// infoGo answers NBD_OPT_INFO or NBD_OPT_GO. ok reports a final NBD_REP_ACK;
// for NBD_OPT_GO the connection is then attached to the export (a), while
// NBD_OPT_INFO only describes it: it never opens the export, so it can never
// take a writer role.
func (c *conn) infoGo(w *bufio.Writer, opt uint32, data []byte) (a *frontend.Attachment, name string, ok bool) {
	// Data: u32 name length, name, u16 n, n × u16 info types.
	if len(data) < 6 {
		optReply(w, opt, repErrInvalid, []byte("option data too short"))
		return nil, "", false
	}
	nameLen := binary.BigEndian.Uint32(data)
	if uint64(nameLen) > uint64(len(data)-6) {
		optReply(w, opt, repErrInvalid, []byte("name length exceeds option data"))
		return nil, "", false
	}
	name = string(data[4 : 4+nameLen])
	rest := data[4+nameLen:]
	nInfo := int(binary.BigEndian.Uint16(rest))
	if len(rest) != 2+2*nInfo {
		optReply(w, opt, repErrInvalid, []byte("info request count does not match option length"))
		return nil, "", false
	}
	if !validName(name) {
		optReply(w, opt, repErrInvalid, []byte("export name is not valid UTF-8 or contains NUL"))
		return nil, "", false
	}
	var wantName, wantDesc bool
	for i := range nInfo {
		switch binary.BigEndian.Uint16(rest[2+2*i:]) {
		case infoName:
			wantName = true
		case infoDescription:
			wantDesc = true
		}
	}

	var info frontend.Info
	var err error
	if opt == optGo {
		if a, err = c.attach(name); err == nil {
			info = a.Info()
		}
	} else {
		info, err = c.describe(name)
	}
	if err != nil {
		if errors.Is(err, frontend.ErrNoSuchExport) {
			optReply(w, opt, repErrUnknown, []byte("no such export: "+truncate(name)))
		} else {
			optReply(w, opt, repErrUnknown, []byte(truncate("export unavailable: "+err.Error())))
		}
		return nil, "", false
	}

	var export [12]byte
	binary.BigEndian.PutUint16(export[0:], infoExport)
	binary.BigEndian.PutUint64(export[2:], uint64(c.size))
	binary.BigEndian.PutUint16(export[10:], c.tflags)
	optReply(w, opt, repInfo, export[:])
	if wantName {
		optReply(w, opt, repInfo, append([]byte{0, infoName}, name...))
	}
	if desc := truncate(info.Description); wantDesc && desc != "" {
		optReply(w, opt, repInfo, append([]byte{0, infoDescription}, desc...))
	}
	// Always sent: the spec lets a server send info that was not asked for, and
	// clients (nbdinfo, qemu) show or use it.
	var bs [14]byte
	binary.BigEndian.PutUint16(bs[0:], infoBlockSize)
	binary.BigEndian.PutUint32(bs[2:], c.minBlock)
	binary.BigEndian.PutUint32(bs[6:], c.prefBlock)
	binary.BigEndian.PutUint32(bs[10:], c.maxPayload)
	optReply(w, opt, repInfo, bs[:])
	optReply(w, opt, repAck, nil)
	return a, name, true
}

// attach joins the named export for transmission (NBD_OPT_GO,
// NBD_OPT_EXPORT_NAME) and computes its size, flags and limits into c.
func (c *conn) attach(name string) (*frontend.Attachment, error) {
	ctx, cancel := context.WithTimeout(c.s.ctx, c.s.cfg.HandshakeTimeout)
	a, err := c.s.cfg.Exports.Attach(ctx, name)
	cancel()
	c.deadline() // the open may have been slow (it can dial the cluster)
	if err != nil {
		return nil, err
	}
	if err := c.setExport(a.Info()); err != nil {
		a.Detach()
		return nil, err
	}
	return a, nil
}

// describe looks the named export up without attaching (NBD_OPT_INFO) and
// computes its size, flags and limits into c.
func (c *conn) describe(name string) (frontend.Info, error) {
	ctx, cancel := context.WithTimeout(c.s.ctx, c.s.cfg.HandshakeTimeout)
	info, err := c.s.cfg.Exports.Describe(ctx, name)
	cancel()
	c.deadline()
	if err != nil {
		return info, err
	}
	return info, c.setExport(info)
}

// setExport computes what the server advertises and enforces for an export.
func (c *conn) setExport(info frontend.Info) error {
	c.size = info.Size
	c.readOnly = info.ReadOnly
	c.minBlock = info.BlockSizes.Minimum
	c.maxPayload = c.s.cfg.MaxPayload
	if m := info.BlockSizes.Maximum; m != 0 && m < c.maxPayload {
		c.maxPayload = m
	}
	c.maxPayload -= c.maxPayload % c.minBlock
	if c.maxPayload == 0 {
		return fmt.Errorf("%w: minimum block size %d exceeds the server's MaxPayload %d",
			frontend.ErrBadInfo, c.minBlock, c.s.cfg.MaxPayload)
	}
	c.prefBlock = min(info.BlockSizes.Preferred, c.maxPayload)
	c.tflags = flagHasFlags | flagCanMultiConn
	if info.CanFlush {
		c.tflags |= flagSendFlush
	}
	if c.readOnly {
		c.tflags |= flagReadOnly
		return nil
	}
	if info.CanFUA {
		c.tflags |= flagSendFUA
	}
	if info.CanTrim {
		c.tflags |= flagSendTrim
	}
	if info.CanWriteZeroes {
		c.tflags |= flagSendWriteZeroes
	}
	return nil
}

// list returns the export names for NBD_OPT_LIST; a failure is logged and
// answered with an empty list.
func (c *conn) list() []string {
	ctx, cancel := context.WithTimeout(c.s.ctx, c.s.cfg.HandshakeTimeout)
	names, err := c.s.cfg.Exports.List(ctx)
	cancel()
	c.deadline()
	if err != nil {
		c.log.Warn("nbd: listing exports for a client failed; answering an empty list", "err", err)
	}
	return names
}

// use records the export chosen for transmission.
func (c *conn) use(name string, a *frontend.Attachment) {
	c.export = name
	c.att = a
	c.backend = a.Backend()
	c.log = c.log.With("export", name)
	c.write = frontend.NewWriteGate(c.s.cfg.MayWrite, name, c.s.cfg.Host, c.s.cfg.MayWriteTTL,
		c.s.cfg.HandshakeTimeout, c.log.With("node", c.s.cfg.Host))
}

// deadline restarts the handshake timer.
func (c *conn) deadline() {
	c.nc.SetDeadline(time.Now().Add(c.s.cfg.HandshakeTimeout))
}

// optReply writes one fixed newstyle option reply.
func optReply(w *bufio.Writer, opt, typ uint32, data []byte) {
	var h [20]byte
	binary.BigEndian.PutUint64(h[0:], optReplyMagic)
	binary.BigEndian.PutUint32(h[8:], opt)
	binary.BigEndian.PutUint32(h[12:], typ)
	binary.BigEndian.PutUint32(h[16:], uint32(len(data)))
	w.Write(h[:])
	w.Write(data)
}

func validName(s string) bool {
	return len(s) <= maxStringLen && utf8.ValidString(s) && !strings.ContainsRune(s, 0)
}

// truncate cuts s to the protocol's string limit, on a rune boundary.
func truncate(s string) string {
	if len(s) <= maxStringLen {
		return s
	}
	s = s[:maxStringLen]
	for len(s) > 0 && !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s
}
