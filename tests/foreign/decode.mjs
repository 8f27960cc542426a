// Decode codedgd frames with protobufjs, as a worker or client written in JavaScript
// against protos/codedgd/v1/codedgd.proto alone would (Node's @grpc/proto-loader uses it).
//
//   node decode.mjs PROTO TYPE FRAME...    one JSON object per frame on stdout
import fs from "node:fs";
import protobuf from "protobufjs";

const [protoPath, typeName, ...frames] = process.argv.slice(2);
const root = await protobuf.load(protoPath);
const type = root.lookupType(typeName);
for (const path of frames) {
  const message = type.decode(fs.readFileSync(path));
  const object = type.toObject(message, { longs: String, bytes: String, defaults: true });
  process.stdout.write(JSON.stringify(object) + "\n");
}
