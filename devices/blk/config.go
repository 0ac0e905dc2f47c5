package blk

import "encoding/binary"

// Feature bits of virtio-blk (virtio 1.2 §5.2.3) this device offers.
const (
	FeatureSizeMax     uint64 = 1 << 1  // VIRTIO_BLK_F_SIZE_MAX: size_max is valid
	FeatureSegMax      uint64 = 1 << 2  // VIRTIO_BLK_F_SEG_MAX: seg_max is valid
	FeatureRO          uint64 = 1 << 5  // VIRTIO_BLK_F_RO: the disk is read-only
	FeatureBlkSize     uint64 = 1 << 6  // VIRTIO_BLK_F_BLK_SIZE: blk_size is valid
	FeatureFlush       uint64 = 1 << 9  // VIRTIO_BLK_F_FLUSH: T_FLUSH is served
	FeatureDiscard     uint64 = 1 << 13 // VIRTIO_BLK_F_DISCARD: T_DISCARD is served
	FeatureWriteZeroes uint64 = 1 << 14 // VIRTIO_BLK_F_WRITE_ZEROES: T_WRITE_ZEROES is served
)

// Limits the device advertises in its configuration space and enforces.
const (
	// SectorSize is the unit of capacity and of every sector number.
	SectorSize = 512
	// BlockSize is the logical block size offered (blk_size). 512, the
	// sector size: any sector-aligned request is then a whole number of
	// blocks, and the guest's filesystems pick their own larger blocks.
	BlockSize = 512
	// QueueSize is the size of the one request queue.
	QueueSize = 256
	// SegMax is the most data segments (buffers holding data) one
	// request may have (seg_max): the queue size less the header and
	// status descriptors, as a driver without indirect descriptors needs.
	SegMax = QueueSize - 2
	// SizeMax is the largest data segment (size_max).
	SizeMax = 128 << 10
	// MaxRequestBytes bounds one T_IN or T_OUT's data: SegMax segments of
	// SizeMax, below virtio.MaxChainBytes.
	MaxRequestBytes = SegMax * SizeMax
	// MaxDiscardSectors bounds one discard or write-zeroes segment
	// (max_discard_sectors, max_write_zeroes_sectors): 1 GiB, so that a
	// write-zeroes done with written zeros stays short.
	MaxDiscardSectors = 1 << 21
	// MaxDiscardSegments is max_discard_seg and max_write_zeroes_seg:
	// Linux sends one range per request unless told more.
	MaxDiscardSegments = 1
	// DiscardAlignment is discard_sector_alignment, in sectors: the host
	// filesystem frees whole 4 KiB blocks, so smaller discards only zero.
	DiscardAlignment = 4096 / SectorSize
	// IDBytes is the length of the T_GET_ID answer (VIRTIO_BLK_ID_BYTES).
	IDBytes = 20
)

// Offsets in struct virtio_blk_config (virtio 1.2 §5.2.4), little-endian.
const (
	cfgCapacity          = 0  // le64, in sectors
	cfgSizeMax           = 8  // le32
	cfgSegMax            = 12 // le32
	cfgCylinders         = 16 // le16, geometry
	cfgHeads             = 18 // u8
	cfgSectors           = 19 // u8
	cfgBlkSize           = 20 // le32
	cfgPhysBlockExp      = 24 // u8, topology
	cfgAlignmentOffset   = 25 // u8
	cfgMinIOSize         = 26 // le16, in blocks
	cfgOptIOSize         = 28 // le32, in blocks
	cfgWriteback         = 32 // u8
	cfgNumQueues         = 34 // le16
	cfgMaxDiscardSectors = 36 // le32
	cfgMaxDiscardSeg     = 40 // le32
	cfgDiscardAlignment  = 44 // le32
	cfgMaxWZSectors      = 48 // le32
	cfgMaxWZSeg          = 52 // le32
	cfgWZMayUnmap        = 56 // u8
	// configSize ends after write_zeroes_may_unmap's padding: the secure
	// erase and zoned fields that follow belong to features not offered.
	configSize = 60
)

// Geometry reported (not offered as VIRTIO_BLK_F_GEOMETRY, so only for
// completeness): the classic 16 heads of 63 sectors.
const (
	geometryHeads   = 16
	geometrySectors = 63
)

// features returns the bits offered for a disk that is read-only or not.
func features(readOnly bool) uint64 {
	f := FeatureSizeMax | FeatureSegMax | FeatureBlkSize | FeatureFlush
	if readOnly {
		return f | FeatureRO
	}
	return f | FeatureDiscard | FeatureWriteZeroes
}

// buildConfig lays out the configuration space of a disk of capacity
// sectors. It never changes afterwards, so ReadConfig needs no lock.
func buildConfig(capacity uint64, readOnly bool) [configSize]byte {
	var c [configSize]byte
	le := binary.LittleEndian
	le.PutUint64(c[cfgCapacity:], capacity)
	le.PutUint32(c[cfgSizeMax:], SizeMax)
	le.PutUint32(c[cfgSegMax:], SegMax)
	le.PutUint16(c[cfgCylinders:], uint16(min(capacity/(geometryHeads*geometrySectors), 0xffff)))
	c[cfgHeads] = geometryHeads
	c[cfgSectors] = geometrySectors
	le.PutUint32(c[cfgBlkSize:], BlockSize)
	c[cfgPhysBlockExp] = 0
	c[cfgAlignmentOffset] = 0
	le.PutUint16(c[cfgMinIOSize:], 1)
	le.PutUint32(c[cfgOptIOSize:], 0)
	// Writes land in the host page cache until a flush: a write-back
	// cache, which is what a driver assumes once FLUSH is negotiated.
	c[cfgWriteback] = 1
	le.PutUint16(c[cfgNumQueues:], 1)
	if !readOnly {
		le.PutUint32(c[cfgMaxDiscardSectors:], MaxDiscardSectors)
		le.PutUint32(c[cfgMaxDiscardSeg:], MaxDiscardSegments)
		le.PutUint32(c[cfgDiscardAlignment:], DiscardAlignment)
		le.PutUint32(c[cfgMaxWZSectors:], MaxDiscardSectors)
		le.PutUint32(c[cfgMaxWZSeg:], MaxDiscardSegments)
		c[cfgWZMayUnmap] = 1
	}
	return c
}
