# The notiflow image: every notiflow process (API, flows, scheduler, expander, emulators, the
# init job, the history archive job) is `notiflow <command>` from this one image, so it carries
# the extras those need: emulators, archive, and ses for an SES route. docker-compose.yml
# builds it.
FROM python:3.11-slim-bookworm
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    NOTIFLOW_STACK_DIR=/var/lib/notiflow
WORKDIR /opt/notiflow
COPY pyproject.toml constraints.txt README.md ./
COPY notiflow ./notiflow
RUN pip install --no-cache-dir -c constraints.txt ".[emulators,archive,ses]" \
    && useradd --system --uid 10001 --home-dir /var/lib/notiflow --create-home notiflow
USER notiflow
ENTRYPOINT ["notiflow"]
CMD ["--help"]
